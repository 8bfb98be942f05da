"""mindvl convert llm: the Hugging Face layouts of Llama, Qwen2 and Gemma 3 (tiny committed models against
transformers' outputs), the converted folder's config, and the errors a user can meet."""
import json
import shutil

import numpy as np
import pytest

from mindvl.cli import main
from mindvl.config import DecoderConfig
from mindvl.errors import ConversionError
from mindvl.pretrained.llm import convert_gguf, convert_hf, expected_shapes, read_llm_config

from conftest import REFERENCES, TINY_LLM_FAMILIES  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny_references():
    return np.load(REFERENCES / "tiny_llms.npz")


@pytest.fixture(scope="module")
def tiny_models(tiny_llms):
    from mindvl import from_pretrained

    return {family: from_pretrained(folder, cache_len=64) for family, folder in tiny_llms.items()}


@pytest.mark.parametrize("family", TINY_LLM_FAMILIES)
def test_tiny_layout_matches_transformers(tiny_models, tiny_references, family):
    model = tiny_models[family]
    for index, prompt in enumerate(tiny_references["prompts"]):
        ids = model.encode(str(prompt))
        assert ids == tiny_references[f"{family}_ids_{index}"].tolist()
        logits = model.logits(ids)
        np.testing.assert_allclose(logits, tiny_references[f"{family}_logits_{index}"], atol=1e-4, rtol=0)
        greedy = model.generate(str(prompt), max_new_tokens=12)
        expected = tiny_references[f"{family}_greedy_{index}"].tolist()
        assert greedy.tokens == expected[:len(greedy.tokens)]  # a stop token may end it earlier
        assert greedy.finish == ("length" if len(greedy.tokens) == 12 else "stop")


def test_config_is_explicit_and_complete(tiny_llms):
    config, cfg = read_llm_config(tiny_llms["gemma3_text"])
    fields = set(DecoderConfig.__dataclass_fields__)
    assert set(config["decoder"]) == fields  # every setting written out, none left to defaults
    assert cfg.layer_types == ["local", "local", "global"] and cfg.sliding_window == 6
    assert cfg.attention_scale == pytest.approx(24 ** -0.5) and cfg.sandwich_norm and cfg.qk_norm
    assert config["tokens"] == {"bos": 1, "eos": 2, "pad": 0, "stop": [2]}
    assert config["parameters"] == sum(int(np.prod(s)) for s in expected_shapes(cfg).values())
    assert all(len(digest) == 64 for digest in config["source"]["files"].values())


def test_damaged_folder_is_refused(tiny_llms, tmp_path):
    folder = shutil.copytree(tiny_llms["llama"], tmp_path / "copy")
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.seek(-4, 2)
        handle.write(b"\0\0\0\1")
    with pytest.raises(ConversionError, match="model.safetensors: missing or its sha256 differs"):
        read_llm_config(folder)


def test_hf_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(ConversionError, match="not a Hugging Face model folder"):
        convert_hf(tmp_path, tmp_path / "out")
    folder = shutil.copytree(REFERENCES / "tiny_llama", tmp_path / "mamba")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    with pytest.raises(ConversionError, match=r"model_type 'mamba' is not supported \(supported: "):
        convert_hf(folder, tmp_path / "out")
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))
    with pytest.raises(ConversionError, match=r"tensor 'model.layers.3.input_layernorm.weight' is missing"):
        convert_hf(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing that looks complete is left behind


def test_gguf_errors_name_the_file_and_the_fix(tmp_path):
    import gguf

    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n" * 100)
    with pytest.raises(ConversionError, match=r"notes.gguf: not a readable GGUF file .*truncated or another format"):
        convert_gguf(text, tmp_path / "out")
    with pytest.raises(ConversionError, match="no such file"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    writer = gguf.GGUFWriter(str(tmp_path / "llama.gguf"), "llama")  # a real GGUF of an architecture not read
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConversionError, match=r"GGUF architecture 'llama' is not supported .* with --hf instead"):
        convert_gguf(tmp_path / "llama.gguf", tmp_path / "out")


def test_truncated_gguf_is_refused(tmp_path):
    from mindvl.pretrained.llm import installed_gguf

    whole = installed_gguf()
    cut = tmp_path / "cut.gguf"
    with open(whole, "rb") as source, open(cut, "wb") as target:
        target.write(source.read(whole.stat().st_size // 2))
    with pytest.raises(ConversionError, match="cut.gguf: .*(truncated|damaged)"):
        convert_gguf(cut, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_converts_and_reports(tmp_path, capsys):
    assert main(["convert", "llm", "--hf", str(REFERENCES / "tiny_qwen2"), "--out", str(tmp_path / "q")]) == 0
    assert "qwen2: " in capsys.readouterr().out
    assert main(["convert", "llm", "--gguf", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "x")]) == 2
    assert "none.gguf: no such file" in capsys.readouterr().err


@pytest.fixture(scope="module")
def quantized_tiny(tmp_path_factory):
    """The tiny Gemma 3 converted with int8 and int4 weights."""
    out = tmp_path_factory.mktemp("quantized")
    return {kind: convert_hf(REFERENCES / "tiny_gemma3_text", out / kind, log=lambda *_: None, weights=kind)
            for kind in ("int8", "int4")}


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_folder_stores_its_layout_and_generates_from_it(quantized_tiny, tiny_llms, tiny_models, kind):
    from safetensors import safe_open

    from mindvl import from_pretrained
    from mindvl.cells.quant import QuantizedLinear

    folder = quantized_tiny[kind]
    config, cfg = read_llm_config(folder)
    assert config["weights"] == kind
    assert config["parameters"] == sum(int(np.prod(s)) for s in expected_shapes(cfg).values())
    with safe_open(str(folder / "model.safetensors"), framework="np") as stored:
        dtypes = {name: stored.get_tensor(name).dtype for name in stored.keys()}
    value = "weight_int8" if kind == "int8" else "weight_int4"
    assert dtypes[f"blocks.0.attn.q_proj.{value}"] == (np.int8 if kind == "int8" else np.uint8)
    assert dtypes["embed.weight_int8"] == dtypes["blocks.0.mlp.fc2.weight_int8"] == np.int8  # int8 in int4 too
    assert dtypes["blocks.0.attn.q_proj.weight_scale"] == np.float32 and "embed.weight" not in dtypes
    assert dtypes["blocks.0.norm1.weight"] == np.float32  # norms stay float32

    model = from_pretrained(folder, cache_len=64)
    assert model.weights == kind and model.lm.quantized_table
    assert sum(isinstance(cell, QuantizedLinear) for _, cell in model.lm.cells_and_names()) == 7 * cfg.layers + 1
    ids = model.encode("The quick brown fox")
    logits, float_logits = model.logits(ids), tiny_models["gemma3_text"].logits(ids)
    error = np.linalg.norm(logits - float_logits) / np.linalg.norm(float_logits)
    assert 0 < error < (0.05 if kind == "int8" else 0.5)  # random tiny weights: measured 0.006 / 0.11
    assert len(model.generate("The quick brown fox", max_new_tokens=6).tokens) >= 1

    # quantizing a float32 folder as it loads gives the same model as the quantized folder
    loaded = from_pretrained(tiny_llms["gemma3_text"], cache_len=64, weights=kind)
    assert loaded.weights == kind
    np.testing.assert_array_equal(loaded.logits(ids), logits)


def test_quantized_weights_are_refused_where_they_cannot_be_given(quantized_tiny, tmp_path):
    from mindvl import from_pretrained
    from mindvl.errors import ConfigError

    with pytest.raises(ConfigError, match="stores int4 weights; convert the source again with `mindvl convert llm "
                                          "--weights int8`"):
        from_pretrained(quantized_tiny["int4"], weights="int8")
    with pytest.raises(ConfigError, match="weights: expected one of"):
        from_pretrained(quantized_tiny["int4"], weights="int2")
    with pytest.raises(ConfigError, match="--weights gguf keeps a GGUF"):
        convert_hf(REFERENCES / "tiny_llama", tmp_path / "x", weights="gguf")
    with pytest.raises(ConfigError, match="--weights: expected one of"):
        convert_hf(REFERENCES / "tiny_llama", tmp_path / "x", weights="q4")


def test_cli_converts_and_generates_quantized(tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["convert", "llm", "--hf", str(REFERENCES / "tiny_qwen2"), "--out", str(out), "--weights", "int4"]) == 0
    assert "int4 weights" in capsys.readouterr().out
    assert main(["generate", "hello", "--model", str(out), "--max-new-tokens", "3"]) == 0
    assert main(["generate", "hello", "--model", str(out), "--weights", "int8"]) == 2
    assert "stores int4 weights" in capsys.readouterr().err
