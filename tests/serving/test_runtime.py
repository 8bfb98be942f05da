"""Unmodified MindSpore Serving 2.0 servables on a live `mindvl serve`: servable_config.py files written as
MindSpore Serving's documentation and its own tests write them (the `add` example, with_batch_dim both
ways, without_batch_dim_inputs, several model files, Python stages calling the model, batch_size stages,
the pre-1.5 call_* names), over bare MindIR files exported here, asked over REST and gRPC. Replies and error
texts are MindSpore Serving's: its tests' phrases (tests/ut/python in mindspore-ai/serving) are asserted."""
import base64
import io

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from PIL import Image

from live import b64, call, config, grpc_predict
from mindvl.serving import grpc_protocol as G
from mindvl.serving.register import ServableError
from mindvl.serving.runtime import load_version
from mindvl.serving.servable import CONFIG_FILE
from mindvl.serving.server import BackgroundServer


class Add(nn.Cell):
    def construct(self, x1, x2):
        return x1 + x2


class AddOne(nn.Cell):
    def construct(self, x1, x2):
        return x1 + x2 + 1


class Sub(nn.Cell):
    def construct(self, x1, x2):
        return x1 - x2


class MeanColour(nn.Cell):
    """(N, 3, H, W) images -> 10 scores: classes 0, 1 and 2 score the mean of the red, green and blue planes."""

    def __init__(self):
        super().__init__()
        self.weight = ms.Tensor(np.eye(3, 10, dtype=np.float32))

    def construct(self, x):
        return ops.matmul(x.mean(axis=(2, 3)), self.weight)


def export(cell, folder, name, *shapes, dtype=ms.float32):
    """`cell` as folder/name (a real MindIR), its inputs of `shapes` (None: a dynamic dimension)."""
    folder.mkdir(parents=True, exist_ok=True)
    inputs = [ms.Tensor(shape=list(shape), dtype=dtype) if None in shape else ms.Tensor(np.zeros(shape), dtype)
              for shape in shapes]
    ms.export(cell, *inputs, file_name=str(folder / name.removesuffix(".mindir")), file_format="MINDIR")


# MindSpore Serving's `add` example (example/tensor_add): a 2x2 float32 add, with_batch_dim=False.
ADD = '''
import numpy as np
from mindspore_serving.server import register


def add_trans_datatype(x1, x2):
    """define preprocess, this example has two inputs and two outputs"""
    return x1.astype(np.float32), x2.astype(np.float32)


# when with_batch_dim is set to False, only 2x2 add is supported
model = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)


@register.register_method(output_names=["y"])
def add_common(x1, x2):  # only support float32 inputs
    y = register.add_stage(model, x1, x2, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def add_cast(x1, x2):
    x1, x2 = register.add_stage(add_trans_datatype, x1, x2, outputs_count=2)  # cast input to float32
    y = register.add_stage(model, x1, x2, outputs_count=1)
    return y
'''

# with_batch_dim=True (the default): dimension 0 of the model is the batch, fixed (4) or dynamic (-1).
BATCH = '''
from mindspore_serving.server import register

fixed = register.declare_model(model_file="add_batch4.mindir", model_format="MindIR")
dynamic = register.declare_model(model_file="add_any_batch.mindir", model_format="MindIR")
bias = register.declare_model(model_file="add_bias.mindir", model_format="MindIR", without_batch_dim_inputs=[1])


@register.register_method(output_names=["y"])
def add_fixed(x1, x2):
    y = register.add_stage(fixed, x1, x2, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def add_dynamic(x1, x2):
    y = register.add_stage(dynamic, x1, x2, outputs_count=1)
    return y


@register.register_method(output_names=["y"])
def add_bias(x, b):
    y = register.add_stage(bias, x, b, outputs_count=1)
    return y
'''

# The names MindSpore Serving deprecated in 1.5 (declare_servable, call_preprocess, call_servable,
# call_postprocess_pipeline), as its 1.x examples wrote them.
LEGACY = '''
import numpy as np
from mindspore_serving.server import register

register.declare_servable(servable_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)


def to_float(x1, x2):
    return x1.astype(np.float32), x2.astype(np.float32)


def describe(instances):
    for instance in instances:
        y = instance[0]
        yield "sum=%g" % y.sum(), y.max()


@register.register_method(output_names=["y", "text", "top"])
def add_describe(x1, x2):
    x1, x2 = register.call_preprocess(to_float, x1, x2)
    y = register.call_servable(x1, x2)
    text, top = register.call_postprocess_pipeline(describe, y)
    return y, text, top
'''

# A model of two files (subgraphs), Python stages that call it themselves, batch_size stages, strings.
PIPELINE = '''
import numpy as np
from mindspore_serving.server import register

tensors = register.declare_model(model_file=["tensor_add.mindir", "tensor_sub.mindir"], model_format="MindIR",
                                 with_batch_dim=False)


def add_then_sub(x1, x2):
    y = tensors.call(x1, x2)  # one instance, subgraph 0: x1 + x2
    return tensors.call(y, x2, subgraph=1)  # subgraph 1: y - x2


def add_many(instances):
    outputs = tensors.call([[x1, x2] for x1, x2 in instances])  # several instances at once
    for y in outputs:
        yield y[0]


def name(text, x):
    if text == "fail":
        raise ValueError("asked to fail")
    return f"{text}:{x.shape}"


@register.register_method(output_names=["x"])
def round_trip(x1, x2):
    x = register.add_stage(add_then_sub, x1, x2, outputs_count=1)
    return x


@register.register_method(output_names=["y"])
def add_batched(x1, x2):
    y = register.add_stage(add_many, x1, x2, outputs_count=1, batch_size=2)
    return y


@register.register_method(output_names=["label"])
def label(text, x):
    label = register.add_stage(name, text, x, outputs_count=1)
    return label
'''


# Shaped like MindSpore Serving's resnet50 example: MindData eager and pipeline preprocessing through the
# c_transforms modules MindSpore 2 renamed, a model with a fixed batch of 2, string and tensor outputs.
COLOURS = """
import numpy as np
import mindspore.dataset as ds
import mindspore.dataset.transforms.c_transforms as TC
import mindspore.dataset.vision.c_transforms as VC
from mindspore_serving.server import register

LABELS = ["red", "green", "blue", "c3", "c4", "c5", "c6", "c7", "c8", "c9"]
SIZE = 32
MEAN = [125.3, 123.0, 113.9]
STD = [51.6, 50.8, 51.3]


def preprocess_eager(image):
    image = VC.Decode()(image)
    image = VC.Resize([SIZE, SIZE])(image)
    image = VC.Normalize(mean=MEAN, std=STD)(image)
    return VC.HWC2CHW()(image)


def preprocess_batch(instances):
    def generator():
        for instance in instances:
            yield (instance[0],)

    images = ds.GeneratorDataset(generator, ["image"], shuffle=False)
    images = images.map(operations=VC.Decode(), input_columns="image", num_parallel_workers=2)
    images = images.map(operations=TC.Compose([VC.Resize([SIZE, SIZE]), VC.Normalize(mean=MEAN, std=STD),
                                               VC.HWC2CHW()]), input_columns="image")
    for data in images.create_dict_iterator(num_epochs=1):
        yield (data["image"],)


def postprocess_top1(score):
    return LABELS[int(np.argmax(score))]


def postprocess_top3(score):
    top = np.argsort(score)[::-1][:3]
    return ";".join(LABELS[i] for i in top), score[top]


model = register.declare_model(model_file="colour_bs2.mindir", model_format="MindIR")


def call_model_batch(instances):
    inputs = [[preprocess_eager(instance[0])] for instance in instances]
    for outputs in model.call(inputs):
        yield postprocess_top1(outputs[0])


@register.register_method(output_names=["label"])
def classify_top1(image):
    x = register.add_stage(preprocess_eager, image, outputs_count=1)
    x = register.add_stage(model, x, outputs_count=1)
    x = register.add_stage(postprocess_top1, x, outputs_count=1)
    return x


@register.register_method(output_names=["label", "score"])
def classify_top3_batch(image):
    x = register.add_stage(preprocess_batch, image, outputs_count=1, batch_size=1024)
    x = register.add_stage(model, x, outputs_count=1)
    label, score = register.add_stage(postprocess_top3, x, outputs_count=2)
    return label, score


@register.register_method(output_names=["label"])
def classify_by_call(image):
    label = register.add_stage(call_model_batch, image, outputs_count=1, batch_size=3)
    return label
"""


def write_servable(root, name, text):
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / CONFIG_FILE).write_text(text)
    return root / name


@pytest.fixture(scope="module")
def servable_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mindspore_serving")
    add = write_servable(root, "add", ADD)
    export(Add(), add / "1", "tensor_add.mindir", (2, 2), (2, 2))
    export(AddOne(), add / "2", "tensor_add.mindir", (2, 2), (2, 2))  # version 2 adds one more
    batch = write_servable(root, "batch", BATCH)
    export(Add(), batch / "1", "add_batch4.mindir", (4, 3), (4, 3))
    export(Add(), batch / "1", "add_any_batch.mindir", (None, 3), (None, 3))
    export(Add(), batch / "1", "add_bias.mindir", (4, 2), (2,))
    legacy = write_servable(root, "legacy", LEGACY)
    export(Add(), legacy / "1", "tensor_add.mindir", (2, 2), (2, 2))
    pipeline = write_servable(root, "pipeline", PIPELINE)
    export(Add(), pipeline / "1", "tensor_add.mindir", (2, 2), (2, 2))
    export(Sub(), pipeline / "1", "tensor_sub.mindir", (2, 2), (2, 2))
    export(MeanColour(), write_servable(root, "colours", COLOURS) / "1", "colour_bs2.mindir", (2, 3, 32, 32))
    return root


@pytest.fixture(scope="module")
def server(servable_dir):
    background = BackgroundServer(config(servable_dir, max_batch_size=8))
    with background as server:
        background.call(server.catalog.load("add", 1))  # MindSpore Serving too starts with the newest only
        yield server


X1 = np.array([[1.1, 2.2], [3.3, 4.4]], np.float32)
X2 = np.array([[5.5, 6.6], [7.7, 8.8]], np.float32)


def rest(server, path, instances):
    status, answer = call(f"{server.rest_url}/model/{path}", {"instances": instances})
    assert status == 200
    return answer


def outputs(answer, name="y"):
    return [np.array(instance[name]) if "error_msg" not in instance else instance["error_msg"]
            for instance in answer["instances"]]


def test_every_servable_loads_with_the_newest_version_by_default(server):
    state = server.catalog.state()
    assert {name: entry["default_version"] for name, entry in state.items()} == \
        {"add": 2, "batch": 1, "colours": 1, "legacy": 1, "pipeline": 1}
    assert state["add"]["versions"]["2"]["methods"] == ["add_cast", "add_common"]
    assert state["add"]["versions"]["1"]["status"] == "loaded"


def test_the_add_example_answers_over_rest_and_grpc_for_each_version(server):
    instances = [{"x1": X1.tolist(), "x2": X2.tolist()}, {"x1": X2.tolist(), "x2": X2.tolist()}]
    newest, first = rest(server, "add:add_common", instances), rest(server, "add/version/1:add_common", instances)
    np.testing.assert_allclose(outputs(first), [X1 + X2, X2 + X2], rtol=1e-6)
    np.testing.assert_allclose(outputs(newest), [X1 + X2 + 1, X2 + X2 + 1], rtol=1e-6)

    reply = grpc_predict(server, "add", "add_common", [{"x1": X1, "x2": X2}], version=1)
    assert not reply.error_msg and reply.servable_spec.version_number == 1
    (result,) = G.results_from_reply(reply)
    assert result["y"].dtype == np.float32 and result["y"].shape == (2, 2)
    np.testing.assert_allclose(result["y"], X1 + X2, rtol=1e-6)


def test_inputs_are_checked_by_size_and_dtype_with_mindspore_serving_messages(server):
    as_ints = {"x1": [[1, 2], [3, 4]], "x2": [[5, 6], [7, 8]]}  # JSON integers arrive as int32
    (cast,) = outputs(rest(server, "add:add_cast", [as_ints]))  # add_cast casts them in a Python stage
    assert cast.tolist() == [[7.0, 9.0], [11.0, 13.0]]
    wide = {"x1": [[1.1, 2.2, 3.3], [3.3, 4.4, 5.5]], "x2": [[5.5, 6.6, 7.7], [7.7, 8.8, 8.8]]}
    wrong_type, wrong_size, good = outputs(rest(server, "add:add_common", [as_ints, wide, {"x1": X1.tolist(),
                                                                                           "x2": X2.tolist()}]))
    assert wrong_type.startswith("Given model input 0 data type kMSI_Int32 not match the data type kMSI_Float32 "
                                 "defined in model")
    assert wrong_size.startswith("Given model input 0 size 24 not match the size 16 defined in model")
    np.testing.assert_allclose(good, X1 + X2 + 1, rtol=1e-6)  # the bad instances fail alone

    reply = grpc_predict(server, "add", "add_common", [{"x1": X1.astype(np.float64), "x2": X2}])
    assert not reply.instances and len(reply.error_msg) == 1  # every instance failed alike: one error for all
    assert reply.error_msg[0].error_msg.decode().startswith(
        "Given model input 0 size 32 not match the size 16 defined in model")


def test_a_b64_tensor_of_the_model_size_takes_the_model_shape(server):
    """MindSpore Serving checks an input's bytes, not its shape: 4 float32 feed a 2x2 input."""
    flat = {"b64": base64.b64encode(X1.reshape(-1).tobytes()).decode(), "type": "fp32", "shape": [4]}
    (y,) = outputs(rest(server, "add/version/1:add_common", [{"x1": flat, "x2": X2.tolist()}]))
    np.testing.assert_allclose(y, X1 + X2, rtol=1e-6)


def test_with_batch_dim_stacks_instances_into_the_model_batch(server):
    rows = np.arange(21, dtype=np.float32).reshape(7, 3)
    instances = [{"x1": row.tolist(), "x2": (row * 10).tolist()} for row in rows]  # 7 rows: batches of 4 + 3
    for method in ("add_fixed", "add_dynamic"):
        np.testing.assert_allclose(outputs(rest(server, f"batch:{method}", instances)), rows * 11, rtol=1e-6)
    instances[2]["x1"] = [1.0, 2.0]  # one instance of the wrong size fails alone
    answers = outputs(rest(server, "batch:add_fixed", instances))
    assert answers[2].startswith("Given model input 0 size 8 not match the size 12 defined in model")
    np.testing.assert_allclose(np.stack(answers[:2] + answers[3:]), np.delete(rows, 2, axis=0) * 11, rtol=1e-6)


def test_inputs_without_batch_dim_are_shared_by_the_instances_that_give_them(server):
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    biases = [[1.0, 1.0], [1.0, 1.0], [5.0, 7.0], [1.0, 1.0], [5.0, 7.0]]
    answers = outputs(rest(server, "batch:add_bias", [{"x": row.tolist(), "b": b} for row, b in zip(x, biases)]))
    np.testing.assert_allclose(answers, x + np.array(biases, np.float32), rtol=1e-6)
    wrong = rest(server, "batch:add_bias", [{"x": [1.0, 2.0], "b": [1.0, 2.0, 3.0]}])
    assert wrong["error_msg"].startswith("Given model input 1 size 12 not match the size 8 defined in model")


def test_the_pre_1_5_call_names_run(server):
    (result,) = rest(server, "legacy:add_describe", [{"x1": [[1, 2], [3, 4]], "x2": [[1, 1], [1, 1]]}])["instances"]
    assert result == {"y": [[2.0, 3.0], [4.0, 5.0]], "text": "sum=14", "top": 5.0}


def test_python_stages_call_the_model_and_its_subgraphs(server):
    (x,) = outputs(rest(server, "pipeline:round_trip", [{"x1": X1.tolist(), "x2": X2.tolist()}]), "x")
    np.testing.assert_allclose(x, X1, rtol=1e-6)
    instances = [{"x1": (X1 * k).tolist(), "x2": X2.tolist()} for k in range(5)]  # batch_size=2: 3 calls
    np.testing.assert_allclose(outputs(rest(server, "pipeline:add_batched", instances)),
                               [X1 * k + X2 for k in range(5)], rtol=1e-6)
    wrong = rest(server, "pipeline:round_trip", [{"x1": [[1.0, 2.0, 3.0]], "x2": X2.tolist()}])["error_msg"]
    assert wrong == ("Call Function 'pipeline.add_then_sub' Failed, method: 'round_trip', stage index(begin with 1): "
                     "1, error msg: Given model input 0 size 12 not match the size 16 defined in model (graph "
                     "tensor_add.mindir input x1: given float32 of shape [1, 3], expected float32 of "
                     "shape [2, 2])")


def test_a_request_whose_instances_all_fail_alike_gets_one_error_msg_as_mindspore_serving_gives(server):
    """MindSpore Serving folds "every instance failed with the same message" into the whole-request form."""
    same = {"x1": [[1, 2], [3, 4]], "x2": [[5, 6], [7, 8]]}  # int32: add_common takes float32
    answer = rest(server, "add:add_common", [same, same])
    assert list(answer) == ["error_msg"] and answer["error_msg"].startswith(
        "Given model input 0 data type kMSI_Int32 not match the data type kMSI_Float32 defined in model")
    different = rest(server, "add:add_common", [same, {"x1": [1.0], "x2": [2.0]}])
    assert [sorted(i) for i in different["instances"]] == [["error_msg"], ["error_msg"]]  # each its own


def test_strings_and_a_failing_python_stage(server):
    instances = [{"text": "ok", "x": [1, 2, 3]}, {"text": "fail", "x": 1}]
    answer = rest(server, "pipeline:label", instances)
    assert answer["instances"][0] == {"label": "ok:(3,)"}
    assert answer["instances"][1] == {"error_msg": "Call Function 'pipeline.name' Failed, method: 'label', stage "
                                                   "index(begin with 1): 1, error msg: asked to fail"}
    reply = grpc_predict(server, "pipeline", "label", [{"text": "grpc", "x": np.zeros((2, 2), np.float32)}])
    assert G.results_from_reply(reply)[0]["label"] == "grpc:(2, 2)"


def png(colour, size):
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


IMAGES = [png((230, 20, 20), (40, 30)), png((10, 240, 30), (64, 64)), png((20, 30, 250), (20, 50)),
          png((200, 10, 40), (33, 33)), png((0, 255, 0), (8, 8))]


def test_a_resnet_shaped_servable_runs_its_mindspore_serving_preprocessing_unchanged(server):
    """Bytes reach the Python stages as uint8 arrays (as in MindSpore Serving), the old c_transforms names
    resolve, a MindData pipeline stage and model.call over several instances run, batches of 2 padded."""
    instances = [{"image": b64(image)} for image in IMAGES]
    expected = ["red", "green", "blue", "red", "green"]
    assert [i["label"] for i in rest(server, "colours:classify_top1", instances)["instances"]] == expected
    assert [i["label"] for i in rest(server, "colours:classify_by_call", instances)["instances"]] == expected
    top3 = rest(server, "colours:classify_top3_batch", instances)["instances"]
    assert [i["label"].split(";")[0] for i in top3] == expected and all(len(i["score"]) == 3 for i in top3)
    reply = grpc_predict(server, "colours", "classify_top3_batch", [{"image": image} for image in IMAGES[:3]])
    results = G.results_from_reply(reply)
    assert [r["label"].split(";")[0] for r in results] == expected[:3]
    assert all(r["score"].dtype == np.float32 and r["score"].shape == (3,) for r in results)


@pytest.mark.parametrize("path, instance, phrase", [
    ("add:add_common", {"x1": X1.tolist()}, "Cannot find input x2 in instance input"),
    ("add:add_nope", {"x1": X1.tolist(), "x2": X2.tolist()}, "method is not available"),
    ("nope:add_common", {"x1": X1.tolist(), "x2": X2.tolist()}, "servable is not available"),
    ("add/version/3:add_common", {"x1": X1.tolist(), "x2": X2.tolist()}, "servable is not available"),
])
def test_requests_that_cannot_run_get_mindspore_serving_phrases(server, path, instance, phrase):
    answer = rest(server, path, [instance])
    assert phrase in (answer.get("error_msg") or answer["instances"][0]["error_msg"])


BROKEN = {
    "a stage giving the model too few inputs": ('''
from mindspore_serving.server import register
model = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)

@register.register_method(output_names=["y"])
def half(x1):
    y = register.add_stage(model, x1, outputs_count=1)
    return y
''', r"method half: The inputs count 1 in register_method not equal to the count 2 defined in model, model info: "
     r"tensor_add\.mindir, subgraph: 0"),
    "a model file missing from the version folder": ('''
from mindspore_serving.server import register
model = register.declare_model(model_file="tensor_mul.mindir", model_format="MindIR")

@register.register_method(output_names=["y"])
def mul(x1, x2):
    y = register.add_stage(model, x1, x2, outputs_count=1)
    return y
''', r"model file tensor_mul\.mindir: not in .*/1 \(it has: tensor_add\.mindir\)"),
    "with_batch_dim on a model whose batch dimensions differ": ('''
from mindspore_serving.server import register
model = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR")

@register.register_method(output_names=["y"])
def add(x1, x2):
    y = register.add_stage(model, x1, x2, outputs_count=1)
    return y
''', r"The shape \[3, 2\] of model input 1 does not match current batch size 2"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_servable_that_does_not_fit_its_model_is_refused_at_load(case, tmp_path):
    text, message = BROKEN[case]
    folder = write_servable(tmp_path, "broken", text)
    shapes = ((2, 2), (3, 2)) if "differ" in case else ((2, 2), (2, 2))
    export(Add() if "differ" not in case else AddBroadcastFirst(), folder / "1", "tensor_add.mindir", *shapes)
    with pytest.raises(ServableError, match=message):
        load_version(tmp_path, "broken", 0)


class AddBroadcastFirst(nn.Cell):
    """x1 (2, 2) + the first two rows of x2 (3, 2): inputs whose dimension 0 differ."""

    def construct(self, x1, x2):
        return x1 + x2[:2]
