"""INT8 weight-only quantization (cells/quantize.py): one Int8Linear against its float layer, the trained model quantized in
place (every Linear replaced, canonical names, int8 storage, an honest report), its answers against the
float model's on the whole test split, and its MindIR export (same outputs, weights stored as int8).

Graph mode throughout; four graphs compile (the single layer, the float and the quantized answer nets,
the loaded MindIR) plus two exports.
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import mind_ir_pb2

from mindvl.cells import AnswerNet, Int8Linear
from mindvl.cells.linear import Linear
from mindvl.data import create_dataset
from mindvl.model_factory import load_model
from mindvl.export.graphs import export_graph, question_inputs
from mindvl.cells.quantize import quantize_model

ms.set_context(mode=ms.GRAPH_MODE)


@pytest.fixture(scope="module")
def models(trained_run):
    """(cfg, float model, quantized model, report): the trained run loaded twice, the second quantized."""
    _, result = trained_run
    cfg, float_model, _ = load_model(result.output_dir)
    _, quantized, _ = load_model(result.output_dir)
    return cfg, float_model, quantized, quantize_model(quantized)


@pytest.fixture(scope="module")
def question_batch(models):
    """Every test question (text and audio both given) in one batch."""
    cfg = models[0]
    batch = next(create_dataset(cfg, "test", question_modality="both", batch_size=256).create_dict_iterator(
        num_epochs=1, output_numpy=True))
    return [Tensor(batch[spec.name]) for spec in question_inputs(cfg.preprocess)]


@pytest.fixture(scope="module")
def answers(models, question_batch):
    """(float probabilities, quantized probabilities) (N, num_answers) on the test split."""
    _, float_model, quantized, _ = models
    return AnswerNet(float_model)(*question_batch).asnumpy(), AnswerNet(quantized)(*question_batch).asnumpy()


def test_int8_linear_matches_float_layer_within_half_a_step_per_weight():
    rng = np.random.default_rng(0)
    linear = Linear(24, 10, lora_rank=4)
    weight = rng.normal(0, 0.02, (10, 24)).astype(np.float32)
    lora_b = rng.normal(0, 0.05, (10, 4)).astype(np.float32)  # a non-trivial LoRA update
    weight[3], lora_b[3] = 0.0, 0.0  # an all-zero channel gets scale 1 and stays exactly zero
    linear.weight.set_data(Tensor(weight))
    linear.lora_b.set_data(Tensor(lora_b))
    linear.bias.set_data(Tensor(rng.normal(0, 0.1, 10).astype(np.float32)))
    merged = linear.merged_state()  # the float layer Int8Linear approximates: LoRA folded in

    layer = Int8Linear.from_linear(linear)
    q, scale = layer.weight_int8.asnumpy(), layer.weight_scale.asnumpy()
    assert scale.shape == (10, 1)  # one group a row: per channel
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and scale[3, 0] == 1.0 and not q[3].any()
    restored = q.astype(np.float32) * scale
    assert (np.abs(restored - merged["weight"]) <= scale / 2 + 1e-9).all()

    x = rng.normal(0, 1, (2, 5, 24)).astype(np.float32)
    y = layer(Tensor(x)).asnumpy()
    assert y.shape == (2, 5, 10)
    np.testing.assert_allclose(y, x @ restored.T + merged["bias"], atol=1e-5)  # what the graph dequantizes
    bound = np.abs(x) @ np.broadcast_to(scale / 2, restored.shape).T  # sum_i |x_i| * scale_c / 2
    assert (np.abs(y - (x @ merged["weight"].T + merged["bias"])) <= bound + 1e-5).all()


def test_every_linear_is_replaced_with_canonical_int8_parameters(models):
    _, float_model, quantized, report = models
    float_linears = {name: cell for name, cell in float_model.cells_and_names() if isinstance(cell, Linear)}
    int8_linears = {name: cell for name, cell in quantized.cells_and_names() if isinstance(cell, Int8Linear)}
    assert not any(isinstance(cell, Linear) for _, cell in quantized.cells_and_names())
    assert set(int8_linears) == set(float_linears) and report["layers"] == len(float_linears)
    assert "fusion.encoder.blocks.0.attn.q_proj" in int8_linears

    names = [param.name for param in quantized.get_parameters()]
    assert names == [path for path, _ in quantized.parameters_and_names()] and len(set(names)) == len(names)
    assert "fusion.encoder.blocks.0.attn.q_proj.weight_int8" in names
    for path, layer in int8_linears.items():
        assert layer.weight_int8.name == f"{path}.weight_int8" and layer.weight_int8.dtype == ms.int8
        assert layer.weight_scale.dtype == ms.float32 and not layer.weight_int8.requires_grad
    # what is not a Linear keeps its float32 weights, untouched
    float_params = dict(float_model.parameters_and_names())
    for path, param in quantized.parameters_and_names():
        if path.rsplit(".", 1)[0] not in int8_linears:
            np.testing.assert_array_equal(param.asnumpy(), float_params[path].asnumpy())

    weights = sum(cell.weight.size for cell in float_linears.values())
    channels = sum(cell.out_width for cell in float_linears.values())
    lora = sum(param.size for path, param in float_params.items() if ".lora_" in path)
    assert report["quantized_parameters"] == weights
    assert report["total_parameters"] == sum(p.size for p in float_params.values()) - lora + channels
    assert report["weight_bytes_float32"] == 4 * weights
    assert report["weight_bytes_quantized"] == weights + 4 * channels
    assert report["weight_bytes_quantized"] < 0.3 * report["weight_bytes_float32"]
    assert 0 < report["max_relative_error"] < 0.02  # per-channel int8: under 1% on Gaussian-like weights


def test_quantized_model_answers_as_the_float_model(answers):
    float_probs, int8_probs = answers
    assert len(float_probs) >= 16
    assert np.abs(float_probs - int8_probs).max() < 5e-3  # measured 4e-4
    assert (float_probs.argmax(-1) == int8_probs.argmax(-1)).mean() >= 0.95  # measured 1.0
    # the 30-step model gives the majority answer to every question, so agreeing argmaxes say little:
    # how the probabilities vary with the input must survive quantization too (measured 1.4% off)
    float_dependent, int8_dependent = float_probs - float_probs.mean(0), int8_probs - int8_probs.mean(0)
    assert np.linalg.norm(int8_dependent - float_dependent) < 0.1 * np.linalg.norm(float_dependent)


def _mindir_tensors(path):
    """{parameter name: (dtype name, stored bytes)} of a MindIR file (names without the graph prefix)."""
    model = mind_ir_pb2.ModelProto()
    model.ParseFromString(path.read_bytes())
    return {param.name.rsplit(":", 1)[-1]: (mind_ir_pb2.TensorProto.DataType.Name(param.data_type),
                                            len(param.raw_data)) for param in model.graph.parameter}


def test_quantized_mindir_keeps_int8_weights_and_answers_as_the_framework(models, question_batch, answers, tmp_path):
    cfg, float_model, quantized, _ = models
    inputs = question_inputs(cfg.preprocess)
    int8_path = export_graph(AnswerNet(quantized), "answer", inputs, tmp_path / "answer_int8.mindir")
    float_path = export_graph(AnswerNet(float_model), "answer", inputs, tmp_path / "answer_float.mindir")
    loaded = nn.GraphCell(ms.load(str(int8_path)))
    np.testing.assert_allclose(loaded(*question_batch).asnumpy(), answers[1], atol=1e-5)

    int8_tensors, float_tensors = _mindir_tensors(int8_path), _mindir_tensors(float_path)
    weights = {name: size for name, (dtype, size) in int8_tensors.items() if name.endswith(".weight_int8")}
    assert weights and all(int8_tensors[name][0] == "INT8" for name in weights)
    assert "fusion.encoder.blocks.0.attn.q_proj.weight_int8" in weights
    scales = sum(int8_tensors[name.replace("_int8", "_scale")][1] for name in weights)
    float_bytes = sum(size for _, size in float_tensors.values())
    int8_bytes = sum(size for _, size in int8_tensors.values())
    # one byte per weight instead of four, plus the float32 scales, and nothing else changed
    assert float_bytes - int8_bytes == 3 * sum(weights.values()) - scales
    assert int8_bytes < 0.4 * float_bytes  # measured 0.37
    # the file shrinks less: the graph's nodes (~200 KB, more with the dequantizing Cast/Mul per layer)
    # outweigh a 32-wide model's weights (measured 0.73)
    assert int8_path.stat().st_size < 0.8 * float_path.stat().st_size


def test_mindvl_export_quantize_writes_a_verified_int8_package(trained_run, tmp_path):
    from mindvl.cli import main
    from mindvl.package_reader import read_manifest

    _, result = trained_run
    out = tmp_path / "int8"
    assert main(["export", "quantize", "--checkpoint", str(result.output_dir), "--out", str(out),
                 "--graph", "image_embed", "--no-eval"]) == 0
    manifest = read_manifest(out)
    assert manifest["compression"]["method"] == "int8-weight-only"
    assert manifest["compression"]["layers"] > 0 and list(manifest["graphs"]) == ["image_embed"]
    assert main(["export", "verify", str(out)]) == 0
