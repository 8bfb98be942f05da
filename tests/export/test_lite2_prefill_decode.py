"""A generative package's lite2/ folder (`mindvl export --target lite2` of a generative run): the generation graphs
at batch 1, down-converted with the rules the decoder's ops need, their parameters in the package's one
weights.bin, the device assets the C++ runner reads, and `export verify` generating the stored questions on Lite
2.0. The converter's new rules and the Lite 2.0 kernels the export works around are checked on small graphs."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from mindvl.export.lite2_folder import BroadcastSelect, ExpTanhGELU, HalfAngleCos
from mindvl.export.lite2_mindir import AS_IS, RULES, convert_mindir, unconvertible
from mindvl.deploy.verify import verify_package
from mindvl.lite import lite2_runtime
from mindvl.lite.lite_model import Context, LiteModel
from mindvl.mindir import mindir_ops, mindir_version, parse
from mindvl.errors import PackageError
from mindvl.package_reader import read_manifest


@pytest.fixture(scope="module")
def exported(generative_package):
    """The session's generative package: --target lite2 with two prompt buckets and a 112-token cache, verified (on
    Lite 2.0 too, when the runtime is here)."""
    return generative_package[1]


class Ops(nn.Cell):
    """The generation graphs' ops that needed new rules: CumSum, Split, BroadcastTo, SumExt, a cast to bool
    (NotEqual on Lite 2.0), Sin, and the export's own Cos, GeLU and Select."""

    def __init__(self):
        super().__init__()
        self.cumsum = ops.CumSum()
        self.split = ops.Split(axis=-1, output_num=2)
        self.cos = HalfAngleCos()
        self.gelu = ExpTanhGELU()
        self.select = BroadcastSelect()

    def construct(self, x, valid):
        positions = self.cumsum(ops.cast(valid, ms.int32), 1)  # (2, 6) from a cast to bool and back
        first, second = self.split(x)  # (2, 6, 4) each
        mask = ops.expand_dims(ops.cast(valid, ms.bool_), 2)  # (2, 6, 1)
        chosen = self.select(mask, ops.broadcast_to(first[:, :1], (2, 1, 4)), second)
        angles = ops.cast(positions, ms.float32)
        return (chosen.sum(axis=2, keepdims=False) + self.cos(angles) + ops.sin(angles), self.gelu(x))


def exported_graph(net: nn.Cell, inputs, path) -> bytes:
    net.set_train(False)
    ms.export(net, *(ms.Tensor(v) for v in inputs), file_name=str(path.with_suffix("")), file_format="MINDIR")
    return path.read_bytes()


def test_the_generation_ops_convert_and_run_on_lite2_as_in_mindspore(tmp_path, lite2_ready):
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(2, 6, 8)).astype(np.float32) * 3, np.array([[0, 0, 1, 1, 1, 1], [1] * 6], np.int32)]
    net = Ops()
    data, converted = convert_mindir(exported_graph(net, inputs, tmp_path / "ops.mindir"), "ops")
    assert {"CumSum", "Split", "BroadcastTo", "SumExt", "Cast", "Sin", "Exp"} <= set(converted)
    assert "NotEqual" in mindir_ops(data) and "SumExt" not in mindir_ops(data)  # their Lite 2.0 forms
    (tmp_path / "ops_v1.mindir").write_bytes(data)
    expected = [o.asnumpy() for o in net(*(ms.Tensor(v) for v in inputs))]
    with LiteModel("lite2").build_from_file(tmp_path / "ops_v1.mindir", context=Context(2)) as model:
        got = list(model.run(inputs).values())
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, atol=2e-6, rtol=0)


class Kernel(nn.Cell):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, x):
        return self.op(x)


def test_lite2_cos_and_gelu_are_approximations_which_the_export_replaces(tmp_path, lite2_ready):
    """Why the lite2 export swaps the rotary embeddings' Cos and the decoder's GeLU (export/lite2_folder.py): Lite 2.0's
    own kernels are off by ~1e-3 and ~5e-4, the replacements by < 1e-6. (If the first asserts fail, Lite 2.0
    was fixed.)"""
    x = np.linspace(-6, 30, 4096, dtype=np.float32)[None]
    errors = {}
    for name, op, reference in (("Cos", ops.Cos(), np.cos), ("HalfAngleCos", HalfAngleCos(), np.cos),
                                ("GeLU", ops.GeLU(), None), ("ExpTanhGELU", ExpTanhGELU(), None)):
        data, _ = convert_mindir(exported_graph(Kernel(op), [x], tmp_path / f"{name}.mindir"), name)
        (tmp_path / f"{name}_v1.mindir").write_bytes(data)
        with LiteModel("lite2").build_from_file(tmp_path / f"{name}_v1.mindir") as model:
            (got,) = model.run([x]).values()
        want = reference(x.astype(np.float64)) if reference else ops.GeLU()(ms.Tensor(x)).asnumpy()
        errors[name] = float(np.abs(got - want).max())
    assert errors["Cos"] > 1e-4 and errors["GeLU"] > 1e-4
    assert errors["HalfAngleCos"] < 1e-6 and errors["ExpTanhGELU"] < 1e-6


def test_an_op_without_a_rule_fails_the_conversion_with_its_name(tmp_path):
    assert "Atan" not in RULES and "Atan" not in AS_IS
    with pytest.raises(PackageError, match=r"graph atan: op Atan has no Lite 2.0 conversion"):
        convert_mindir(exported_graph(Kernel(ops.Atan()), [np.ones((2, 3), np.float32)], tmp_path / "a.mindir"),
                       "atan")


def test_a_set_argument_lite2_has_no_place_for_is_refused(tmp_path):
    class Sum(nn.Cell):
        def construct(self, x):
            return x.sum(axis=1, dtype=ms.float32)

    with pytest.raises(PackageError, match=r"graph sum: op SumExt input 3 is set; Lite 2.0's ReduceSum has no such"):
        convert_mindir(exported_graph(Sum(), [np.ones((2, 3), np.float32)], tmp_path / "s.mindir"), "sum")


def test_the_lite2_folder_holds_the_generation_graphs_over_the_package_weights(exported):
    package = exported
    manifest = read_manifest(package)
    lite2 = manifest["lite2"]
    assert list(lite2["graphs"]) == ["attachments", "prefill_32", "prefill_48", "decode"] and lite2["batch"] == 1
    used = set()
    for name, entry in lite2["graphs"].items():
        data = (package / entry["file"]).read_bytes()
        assert mindir_version(data) == 1 and entry["batch"] == 1 and entry["inputs"][0]["shape"][0] == 1
        assert not {"LayerNorm", "Cos", "GeLU", "Rsqrt", "SumExt"} & set(mindir_ops(data))
        used |= set(entry["ops"])
        # no weights of their own: every parameter is external data in the package's weights.bin
        parameters = parse(data).graph.parameter
        assert parameters and all(p.external_data.location == "../weights.bin" and not p.raw_data
                                  for p in parameters)
    assert unconvertible(used) == [] and {"CumSum", "Split", "BroadcastTo", "Sin"} <= used
    weights = lite2["weights"]
    assert weights["bytes"] == sum(manifest["files"][e["file"]]["bytes"] for e in lite2["graphs"].values())
    assert weights["inline_bytes"] > weights["bytes"] + manifest["weights"]["weights_bytes"]  # the copies avoided


def test_the_device_assets_say_what_the_runner_needs(exported):
    from tokenizers import Tokenizer

    package = exported
    manifest = read_manifest(package)
    spec, template = manifest["generation"], manifest["lite2"]["chat_template"]
    lines = {line.split(" ")[0]: line.split(" ")[1:] for line in
             (package / "lite2" / "generation.txt").read_text().splitlines()}
    for key in ("cache_len", "layers", "vocab_size", "kv_width", "image_tokens", "audio_tokens", "pad_id",
                "max_new_tokens"):
        assert lines[key] == [str(spec[key])], key
    assert lines["buckets"] == ["32", "48"] and lines["stop_ids"] == [str(i) for i in spec["stop_ids"]]
    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    assert template == {"bos": "[BOS]", "user": "[CLS]", "assistant": "[SEP]", "end": "[EOS]", "stop": "[EOS]",
                        "image_open": "", "image_close": "", "audio_open": "", "audio_close": ""}
    for part in ("bos", "user", "assistant", "end"):
        assert lines[part] == [str(tokenizer.token_to_id(template[part]))]
    assert lines["image_open"] == [] and lines["template"] == ["word"]
    vocab = (package / "lite2" / "vocab.txt").read_text().splitlines()
    assert len(vocab) == spec["vocab_size"] and vocab[int(lines["bos"][0])] == "[BOS]"
    preprocess = dict(line.split(" ", 1) for line in (package / "lite2" / "preprocess.txt").read_text().splitlines())
    assert preprocess["graph_decode"] == "lite2/decode.mindir" and preprocess["batch"] == "1"
    assert not (package / "lite2" / "labels.txt").exists()


def test_verify_generates_the_stored_questions_on_lite2(exported, lite2_ready):
    report = verify_package(exported)
    assert report.ok, report.summary()
    tokens = [c for c in report.checks if c.graph == "lite2/generate"]
    assert len(tokens) == 4 and all(c.ok and c.max_abs_diff == 0 for c in tokens)
    graphs = {c.graph for c in report.checks if c.graph.startswith("lite2/") and c.graph != "lite2/generate"}
    assert graphs == {"lite2/attachments", "lite2/prefill_32", "lite2/prefill_48", "lite2/decode"}


def test_verify_says_why_the_lite2_generation_was_not_run(exported, monkeypatch):
    monkeypatch.setattr(lite2_runtime, "status", lambda: "no C++ compiler (g++) on PATH")
    report = verify_package(exported)
    assert report.ok and not any(c.graph.startswith("lite2/") for c in report.checks)
    assert report.notes == ["lite2 graphs not run: no C++ compiler (g++) on PATH"]


def test_a_generative_lite2_batch_other_than_1_is_refused_before_anything_is_written(generative_run, tmp_path):
    from mindvl.deploy.export_pipeline import PackageOptions, package_and_check
    from mindvl.model_factory import load_model

    cfg, model, record = load_model(generative_run[1].output_dir)
    with pytest.raises(PackageError, match="--lite2-batch 2: a generative package's lite2 graphs have batch 1"):
        package_and_check(cfg, model, record, tmp_path / "p", PackageOptions(lite2_batch=2, progress=False),
                          log=print)
    assert not (tmp_path / "p").exists()

