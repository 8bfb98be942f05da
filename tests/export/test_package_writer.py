"""The model package: written from a real checkpoint, loaded back with no Python model, verified, and
refused when anything about it is wrong (missing checkpoint, config mismatch, tampered file, no key)."""
import json

import mindspore as ms
import numpy as np
import pytest

from mindvl.cli import main
from mindvl.data import load_meta, load_tokenizer
from mindvl.eval.vqa import greedy_decode, vqa_nets
from mindvl.errors import CheckpointError, PackageError
from mindvl.package_reader import load_graph, load_samples, read_key, read_manifest
from mindvl.deploy.evaluate_package import comparison_table, evaluate_package
from mindvl.export.graphs import graph_specs
from mindvl.export.package_writer import sample_graph_inputs, sample_inputs, write_package
from mindvl.model_factory import load_model
from mindvl.deploy.verify import verify_package

KEY = bytes(range(32))


@pytest.fixture(scope="module")
def source(trained_run):
    _, result = trained_run
    return (result.output_dir, *load_model(result.output_dir))


@pytest.fixture(scope="module")
def package(source, tmp_path_factory):
    _, cfg, model, record = source
    return write_package(cfg, model, tmp_path_factory.mktemp("pkg") / "tiny", record, progress=False)


@pytest.fixture(scope="module")
def encrypted(source, tmp_path_factory):
    """Only the image graph, with a static batch-2 variant, encrypted."""
    _, cfg, model, record = source
    return write_package(cfg, model, tmp_path_factory.mktemp("pkg") / "enc", record, static_batches=[2], key=KEY,
                         progress=False, graphs=["image_embed"])


def test_manifest_describes_every_graph_and_file(package, source):
    _, cfg, model, record = source
    manifest = read_manifest(package)
    assert set(manifest["graphs"]) == {"vqa", "image_embed", "text_embed", "audio_embed"}
    vqa = manifest["graphs"]["vqa"]
    assert vqa["batch"] == "dynamic"
    assert [t["name"] for t in vqa["inputs"]] == ["image", "question_ids", "question_mask", "audio_mel",
                                                 "audio_mask", "use_text", "use_audio"]
    assert vqa["inputs"][0]["shape"] == [-1, 3, cfg.preprocess.image_size, cfg.preprocess.image_size]
    assert [(t["name"], t["dtype"], t["shape"]) for t in vqa["outputs"]] == [
        ("answer_logits", "float32", [-1, cfg.model.num_answers]),
        ("answer_ids", "int32", [-1, cfg.preprocess.max_answer_length - 1])]
    assert manifest["labels"] == load_meta(cfg.data.root)["answers"]
    assert manifest["preprocess"]["image_mean"] == cfg.preprocess.image_mean
    assert manifest["preprocess"]["tokenizer"] == "tokenizer.json"
    assert manifest["source"]["sha256"] == record["sha256"] and manifest["source"]["step"] == record["step"]
    assert manifest["mindspore_version"] == ms.__version__ and manifest["mindvl_version"]
    assert manifest["parameters"] == sum(int(np.prod(p.shape)) for p in model.get_parameters())
    on_disk = {str(p.relative_to(package)) for p in package.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    assert {"vqa.mindir", "tokenizer.json", "config.json", "samples/vqa.safetensors"} <= on_disk


def test_verify_passes_on_a_fresh_package(package):
    report = verify_package(package)
    assert report.ok and report.files == len(read_manifest(package)["files"])
    assert {(c.graph, c.output) for c in report.checks} >= {("vqa", "answer_logits"), ("vqa", "answer_ids"),
                                                            ("audio_embed", "audio_embedding")}
    assert main(["export", "verify", str(package)]) == 0


def test_the_vqa_graph_answers_and_decodes_as_evaluation_does(package, source):
    """The in-graph greedy decoding gives the ids mindvl.eval's step-by-step decoding gives."""
    _, cfg, model, _ = source
    manifest = read_manifest(package)
    inputs, _ = load_samples(package, manifest, "vqa")
    logits, ids = load_graph(package, manifest, "vqa")(*(ms.Tensor(v) for v in inputs.values()))
    answer_net, generate_net, encode_net = vqa_nets(model)
    tensors = {k: ms.Tensor(v) for k, v in inputs.items()}
    image_tokens, question_tokens, audio_tokens = encode_net(
        *(tensors[k] for k in ("image", "question_ids", "question_mask", "audio_mel", "audio_mask")))
    states = [image_tokens, question_tokens, tensors["question_mask"], audio_tokens, tensors["audio_mask"],
              tensors["use_text"], tensors["use_audio"]]
    probabilities = answer_net(*states).asnumpy()
    expected_ids = greedy_decode(generate_net, states, load_tokenizer(cfg.data.root), cfg.preprocess.max_answer_length)
    np.testing.assert_allclose(ms.ops.softmax(logits, -1).asnumpy(), probabilities, atol=1e-5)
    np.testing.assert_array_equal(ids.asnumpy(), expected_ids)
    assert set(inputs["use_text"].tolist()) == {0.0, 1.0}  # the samples mix text, audio and both


def test_a_tampered_file_is_named(package, tmp_path, writable_copy):
    target = writable_copy(package, tmp_path)
    data = bytearray((target / "vqa.mindir").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (target / "vqa.mindir").write_bytes(bytes(data))
    with pytest.raises(PackageError, match=r"vqa\.mindir: sha256 differs"):
        verify_package(target)
    assert main(["export", "verify", str(target)]) == 2


def test_a_wrong_expected_output_fails_verification_naming_graph_and_output(package, tmp_path, capsys,
                                                                           writable_copy):
    """Samples edited and re-hashed: the hashes pass, the comparison must not."""
    from safetensors.numpy import load_file, save_file
    from mindvl.files import sha256_file

    target = writable_copy(package, tmp_path)
    path = target / "samples" / "text_embed.safetensors"
    stored = load_file(str(path))
    stored["output.text_embedding"] = stored["output.text_embedding"] + 1e-2
    save_file(stored, str(path))
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["files"]["samples/text_embed.safetensors"]["sha256"] = sha256_file(path)
    (target / "manifest.json").write_text(json.dumps(manifest))
    report = verify_package(target)
    assert not report.ok
    assert [(c.graph, c.output) for c in report.failures()] == [("text_embed", "text_embedding")]
    assert main(["export", "verify", str(target)]) == 1
    assert "graph text_embed output text_embedding" in capsys.readouterr().out


def test_a_malformed_manifest_is_named(package, tmp_path, writable_copy):
    target = writable_copy(package, tmp_path)
    (target / "manifest.json").write_text("{not json")
    with pytest.raises(PackageError, match="manifest.json: not valid JSON"):
        verify_package(target)
    (target / "manifest.json").unlink()
    with pytest.raises(PackageError, match="not a model package"):
        verify_package(target)


def test_an_existing_package_is_not_overwritten_without_force(package, source):
    _, cfg, model, record = source
    with pytest.raises(PackageError, match="already exists; pass --force"):
        write_package(cfg, model, package, record, progress=False)


def test_encrypted_static_package_needs_its_key(encrypted, source):
    _, cfg, _, _ = source
    manifest = read_manifest(encrypted)
    assert manifest["encryption"]["mode"] == "AES-GCM"
    assert set(manifest["graphs"]) == {"image_embed", "image_embed_b2"}
    static = manifest["graphs"]["image_embed_b2"]
    assert static["batch"] == 2 and static["inputs"][0]["shape"][0] == 2
    assert verify_package(encrypted, KEY).ok
    with pytest.raises(PackageError, match="graph image_embed .*encrypted .*--key-file"):
        verify_package(encrypted)
    with pytest.raises(PackageError, match="graph image_embed .*wrong key"):
        verify_package(encrypted, bytes(32))


def test_keys_come_from_a_file_or_the_environment(tmp_path, monkeypatch):
    (tmp_path / "raw").write_bytes(KEY)
    (tmp_path / "hex").write_text(KEY.hex() + "\n")
    assert read_key(str(tmp_path / "raw")) == KEY == read_key(str(tmp_path / "hex"))
    monkeypatch.setenv("MINDVL_TEST_KEY", KEY[:16].hex())
    assert read_key(key_env="MINDVL_TEST_KEY") == KEY[:16]
    assert read_key() is None
    (tmp_path / "short").write_text("abcd")
    with pytest.raises(PackageError, match="short: expected an AES key of 16, 24 or 32"):
        read_key(str(tmp_path / "short"))
    with pytest.raises(PackageError, match="MINDVL_MISSING_KEY: not set"):
        read_key(key_env="MINDVL_MISSING_KEY")
    with pytest.raises(PackageError, match="not both"):
        read_key(str(tmp_path / "raw"), "MINDVL_TEST_KEY")


def test_a_missing_checkpoint_or_a_mismatched_config_is_named(source, tmp_path, capsys):
    run, cfg, _, _ = source
    assert main(["export", "--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "p")]) == 2
    assert "no checkpoint found" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match=r"--config tiny does not match the checkpoint: .*(missing \['|has shape)"):
        load_model(run, "tiny", [f"data.root={cfg.data.root}", "model.fusion.width=64"])
    assert not (tmp_path / "p").exists()


def test_evaluation_row_and_comparison_table(package):
    row = evaluate_package(package, progress=False, repeats=2)
    for name in ("vqa_text", "vqa_audio", "image_to_caption_r1", "audio_to_text_r1"):
        assert 0.0 <= row[name] <= 1.0
    assert row["latency_ms_b1"] > 0 and row["graph_bytes"] > 0
    table = comparison_table([package, package])
    assert table.count(f"| {package.name} | none | {row['parameters']:,} |") == 2
    assert "100.0%" in table  # VQA kept, relative to itself


def test_onnx_export_runs_in_onnxruntime_as_the_framework_does(source, tmp_path, capsys):
    """Erf and Rsqrt have no MindSpore 2.10 ONNX converter: they are swapped for standard-op formulations
    during the export only, and onnxruntime (the peer) then computes what the framework computes."""
    import onnxruntime

    run, cfg, model, _ = source
    assert main(["export", "onnx", "--checkpoint", str(run), "--out", str(tmp_path / "onnx"), "--graph", "vqa"]) == 0
    report = json.loads((tmp_path / "onnx" / "onnx_report.json").read_text())
    assert report["ok"] and list(report["graphs"]) == ["vqa"] and "Erf" in report["substituted"]
    spec = graph_specs(cfg.preprocess, cfg.model.embed_dim, cfg.model.num_answers, load_tokenizer(cfg.data.root))["vqa"]
    assert report["graphs"]["vqa"]["inputs"] == [t.name for t in spec.inputs]  # the manifest's names
    assert "vqa          ok: vqa.onnx" in capsys.readouterr().out
    inputs = sample_graph_inputs(spec, sample_inputs(cfg, 3))
    logits, ids = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "vqa.onnx")).run(None, inputs)
    expected_logits, expected_ids = spec.build(model)(*(ms.Tensor(v) for v in inputs.values()))
    np.testing.assert_allclose(logits, expected_logits.asnumpy(), atol=1e-5)
    np.testing.assert_array_equal(ids, expected_ids.asnumpy())


def test_an_operator_the_onnx_exporter_lacks_is_named(source, tmp_path, monkeypatch):
    """Without the substitution the export stops at Erf: the report names graph and operator."""
    from contextlib import nullcontext
    import mindvl.export.onnx as onnx_export

    _, cfg, model, _ = source
    monkeypatch.setattr(onnx_export, "portable_ops", lambda model: nullcontext())
    report = onnx_export.export_onnx(cfg, model, tmp_path / "onnx", graphs=["text_embed"])
    assert not report["ok"] and report["graphs"]["text_embed"]["op"] == "Erf"
    assert "text_embed   FAILED at op Erf" in report["summary"]
