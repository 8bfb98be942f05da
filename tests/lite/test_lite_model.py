"""LiteModel: the mindspore_lite API over the Lite 2.0 runtime (the registry wheel, in a worker process)
and GraphCell, which agree on a real package; resize, chunked batches, bad inputs, a dead worker, and a
runtime that cannot be prepared, each with a clear error."""
import os
import signal

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindvl.cli import main
from mindvl.export.lite2_mindir import convert_mindir
from mindvl.lite import lite2_runtime
from mindvl.lite.lite_model import BACKENDS, Context, LiteError, LiteModel, backend_report
from mindvl.package_reader import load_samples, read_manifest


@pytest.fixture(scope="module")
def dense_v1(tmp_path_factory, lite2_ready):
    """A static (2, 8) -> (2, 4) Dense + ReLU graph for Lite 2.0, and the framework's function."""
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(8, 4), nn.ReLU())
    net.set_train(False)
    folder = tmp_path_factory.mktemp("dense")
    ms.export(net, ms.Tensor(np.zeros((2, 8), np.float32)), file_name=str(folder / "dense"), file_format="MINDIR")
    data, _ = convert_mindir((folder / "dense.mindir").read_bytes(), "dense")
    (folder / "dense_v1.mindir").write_bytes(data)
    return folder / "dense_v1.mindir", lambda x: net(ms.Tensor(x)).asnumpy()


def test_the_report_names_every_backend_and_graphcell_is_always_there():
    rows = backend_report()
    assert [row["backend"] for row in rows] == list(BACKENDS)
    assert rows[2]["available"] and "mindspore 2.10" in rows[2]["detail"]
    assert all(row["detail"] for row in rows)


def test_lite_info_on_the_command_line(capsys):
    assert main(["lite", "info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(BACKENDS)
    assert sum("active" in line.split()[1] for line in lines) == 1


def test_the_mindspore_lite_api_shape_on_lite2_with_resize(dense_v1):
    path, reference = dense_v1
    x = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    model = LiteModel("lite2").build_from_file(str(path), "mindir", Context(thread_num=2))
    try:
        inputs = model.get_inputs()
        assert [(t.shape, t.dtype) for t in inputs] == [((2, 8), np.float32)]
        model.resize(inputs, [[5, 8]])
        assert inputs[0].shape == (5, 8) and model.get_inputs()[0].shape == (5, 8)
        inputs[0].set_data_from_numpy(x)
        (output,) = model.predict(inputs)
        np.testing.assert_allclose(output.get_data_to_numpy(), reference(x), atol=1e-6)
        assert model.last_predict_seconds > 0
        with pytest.raises(LiteError, match=r"input .*: got float64\[5, 8\], the model expects float32\[5, 8\]"):
            inputs[0].set_data_from_numpy(x.astype(np.float64))
    finally:
        model.close()


def test_lite2_and_graphcell_agree_on_the_package_and_batches_run_in_chunks(vqa_package, lite2_ready):
    _, package = vqa_package
    manifest = read_manifest(package)
    inputs, expected = load_samples(package, manifest, "vqa")  # 3 rows; the lite2 graph has static batch 1
    with LiteModel.from_package(package, "vqa", backend="lite2") as lite2, \
            LiteModel.from_package(package, "vqa", backend="graphcell") as graphcell:
        assert lite2.backend_name == "lite2" and graphcell.backend_name == "graphcell"
        on_lite2, on_graphcell = lite2.run(inputs), graphcell.run(inputs)
        assert list(on_lite2) == ["answer_logits", "answer_ids"]
        for name, want in expected.items():
            assert on_lite2[name].shape == want.shape
            np.testing.assert_allclose(on_lite2[name], on_graphcell[name], atol=1e-4, rtol=1e-4)
            np.testing.assert_allclose(on_graphcell[name], want, atol=1e-5)
        one = lite2.run({name: value[2:] for name, value in inputs.items()})  # by name, one row
        np.testing.assert_allclose(one["answer_logits"], on_lite2["answer_logits"][2:], atol=1e-6)


def test_wrong_use_gets_clear_errors(vqa_package, dense_v1, tmp_path):
    path, _ = dense_v1
    with pytest.raises(LiteError, match="backend 'tflite': choose auto, mindspore_lite, lite2, graphcell"):
        LiteModel("tflite")
    with pytest.raises(LiteError, match="not built: call build_from_file first"):
        LiteModel("graphcell").get_inputs()
    with pytest.raises(LiteError, match="missing.mindir: no such model file"):
        LiteModel("lite2").build_from_file(tmp_path / "missing.mindir")
    with pytest.raises(LiteError, match="use 1 or more threads"):
        Context(thread_num=0)
    standard = vqa_package[1] / "text_embed_b1.mindir"  # MindIR version 3: Lite 2.0 refuses it
    with pytest.raises(LiteError, match="could not build"):
        LiteModel("lite2").build_from_file(standard)
    with LiteModel("lite2").build_from_file(path) as model:
        with pytest.raises(LiteError, match=r"run: input .* has shape \[2, 3\]"):
            model.run([np.zeros((2, 3), np.float32)])
    with pytest.raises(LiteError, match="has no Lite 2.0 graph|graph nothing: not in"):
        LiteModel.from_package(vqa_package[1], "nothing", backend="lite2")


def test_a_dead_worker_is_reported_not_hung(dense_v1):
    path, _ = dense_v1
    model = LiteModel("lite2").build_from_file(path)
    os.kill(model._backend.process.pid, signal.SIGKILL)
    model._backend.process.wait()
    with pytest.raises(LiteError, match="worker process is not running"):
        model.run([np.zeros((2, 8), np.float32)])
    model.close()


def test_a_runtime_that_cannot_be_prepared_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("MINDVL_LITE2_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MINDVL_LITE2_WHEEL", str(tmp_path / "nowhere.whl"))
    assert "MINDVL_LITE2_WHEEL" in lite2_runtime.status() and "no such file" in lite2_runtime.status()
    broken = tmp_path / "mindspore_lite-2.0.0-cp37-cp37m-manylinux1_x86_64.whl"
    broken.write_bytes(b"PK\x03\x04 truncated")
    monkeypatch.setenv("MINDVL_LITE2_WHEEL", str(broken))
    assert "not a readable wheel" in lite2_runtime.status()
    assert not (tmp_path / "home" / "mindspore_lite").exists()  # nothing half unpacked
    row = next(r for r in backend_report() if r["backend"] == "lite2")
    assert not row["available"] and "not a readable wheel" in row["detail"]
    with pytest.raises(LiteError, match="the Lite 2.0 runtime is unavailable: .*not a readable wheel"):
        LiteModel("lite2").build_from_file(broken)  # any existing file: the runtime fails first
