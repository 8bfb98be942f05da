"""`mindvl serve` end to end: real servers on free ports of 127.0.0.1 over a deployed package, queried with
urllib (REST) and a grpc channel. Every value encoding reaches a method and comes back as MindSpore Serving
encodes it, every protocol error is answered (HTTP 200 with error_msg, or its 4xx/5xx in strict mode),
batched answers equal unbatched ones, gRPC equals REST, and the limits hold."""
import base64
import io
import ipaddress
import re
import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from PIL import Image

from live import (QUESTION_MODES, b64, call, config, grpc_predict, grpc_raw, metrics, predict, rest_inputs,
                  total, vqa_inputs)
from mindvl.cli.main import main
from mindvl.errors import ConfigError
from mindvl.data import load_meta, load_tokenizer
from mindvl.data.reading.examples import query_examples
from mindvl.serving import grpc_protocol as G
from mindvl.serving.servable import CONFIG_FILE, deploy
from mindvl.serving.serve_config import ServeConfig
from mindvl.serving.runtime import GRAPH_LOCK
from mindvl.serving.server import BackgroundServer

# A hand-written servable over the same package: typed tensors straight into the text_embed graph, a Python
# stage whose outputs are a bare scalar, a str and bytes, and a method without stages (its input comes back).
TENSORS_CONFIG = '''
import numpy as np
from mindspore_serving.server import register

text_embed = register.declare_model(model_file="text_embed.mindir", model_format="MindIR", with_batch_dim=True)


def describe(embedding):
    return np.float32(np.linalg.norm(embedding)), f"{embedding.shape[0]} floats", embedding.astype("<f4").tobytes()


@register.register_method(output_names=["embedding", "norm", "summary", "raw"])
def embed_ids(text_ids, text_mask):
    embedding = register.add_stage(text_embed, text_ids, text_mask, outputs_count=1)
    norm, summary, raw = register.add_stage(describe, embedding, outputs_count=3)
    return embedding, norm, summary, raw


@register.register_method(output_names=["value"])
def echo(value):
    return value
'''
FLOAT_TOLERANCE = 1e-5  # batched vs unbatched: the graphs may sum floats in another order per batch size


@pytest.fixture(scope="module")
def servables(vqa_package, tmp_path_factory):
    """vqa (generated config: predict, embed_image/text/audio) and tensors (TENSORS_CONFIG), version 1 each."""
    folder = tmp_path_factory.mktemp("servables")
    deploy(vqa_package[1], folder, "vqa")
    (folder / "tensors").mkdir()
    (folder / "tensors" / CONFIG_FILE).write_text(TENSORS_CONFIG)
    deploy(vqa_package[1], folder, "tensors")
    return folder


@pytest.fixture(scope="module")
def server(servables):
    """Default settings: MindSpore Serving's HTTP 200 for errors, dynamic batching up to 8 instances."""
    with BackgroundServer(config(servables, max_batch_size=8)) as server:
        yield server


@pytest.fixture(scope="module")
def strict(servables):
    """4xx/5xx statuses, no batching (the unbatched reference), at most 4 instances and 0.5 MB a request."""
    with BackgroundServer(config(servables, strict_http=True, batching=False, max_instances=4,
                                 max_request_mb=0.5)) as server:
        yield server


@pytest.fixture(scope="module")
def examples(vqa_package):
    return query_examples(vqa_package[0].data.root)


@pytest.fixture(scope="module")
def text_ids(vqa_package):
    """text_ids(text) -> (ids int32, mask float32) as the generated embed_text's stage makes them."""
    cfg = vqa_package[0]
    tokenizer = load_tokenizer(cfg.data.root)
    return lambda text: tokenizer.encode(text, cfg.preprocess.max_text_length)


def typed(array, type_name, dtype):
    """{"b64", "type", "shape"} of `array` sent as `dtype` (little-endian)."""
    array = np.asarray(array, dtype)
    return {**b64(array.tobytes()), "type": type_name, "shape": list(array.shape)}


# ----------------------------------------------------------------------------- values

TYPED = [  # (type name, little-endian dtype, values): every numeric type of the protocol at its limits
    ("int8", "<i1", [[-128, 0, 127]]), ("int16", "<i2", [-32768, 32767]), ("int32", "<i4", [[-2 ** 31], [2 ** 31 - 1]]),
    ("int64", "<i8", [2 ** 62, -2 ** 62]), ("uint8", "<u1", [0, 255]), ("uint16", "<u2", [65535]),
    ("uint32", "<u4", [2 ** 32 - 1]), ("uint64", "<u8", [2 ** 64 - 1, 0]), ("fp16", "<f2", [0.5, -1.25]),
    ("float16", "<f2", [[2048.0]]), ("fp32", "<f4", [[1.5, -2.25]]), ("float32", "<f4", 0.75),
    ("fp64", "<f8", [1e300, -1e-300]), ("float64", "<f8", [[[0.1]]]), ("bool", "|b1", [True, False, True]),
]
PLAIN = [  # (JSON value sent, JSON value expected back)
    (7, 7), (-2.5, -2.5), (True, True), ("naïve ✓", "naïve ✓"), ([[1, 2], [3, 4]], [[1, 2], [3, 4]]),
    ([[0.5], [-1.5]], [[0.5], [-1.5]]), ([True, False], [True, False]), (["only"], "only"),
    ([b64(b"\x00\xff")], b64(b"\x00\xff")), (b64(b"\x00\xffraw"), b64(b"\x00\xffraw")),
    ({**b64("héllo".encode()), "type": "str"}, "héllo"), ({**b64(b"\x01"), "type": "bytes"}, b64(b"\x01")),
    ({**b64(b"\x00\x02"), "type": "bool", "shape": [2]}, [False, True]),  # any nonzero byte is true
    ({"b64": "", "type": "fp32", "shape": [0]}, []),
]


def test_every_value_encoding_reaches_a_method_and_comes_back(server):
    """A method returning its input: JSON scalars, nested lists, one-string lists and every b64 type come
    back as MindSpore Serving encodes replies (tensors as nested lists, scalars bare, bytes as {"b64"})."""
    sent = [value for value, _ in PLAIN] + [typed(values, name, dtype) for name, dtype, values in TYPED]
    expected = [value for _, value in PLAIN] + [np.asarray(values, dtype).tolist()
                                                for name, dtype, values in TYPED]
    replies = predict(server, "tensors:echo", [{"value": value} for value in sent])
    assert replies == [{"value": value} for value in expected]


def test_every_tensor_type_round_trips_over_grpc(server):
    """MSService tensors of every dtype, str and bytes reach a method and come back with dtype and shape."""
    values = [np.asarray(values, dtype).astype(np.dtype(dtype).newbyteorder("=")) for _, dtype, values in TYPED]
    values += ["héllo", b"\x00\xff", np.zeros((0, 3), np.float32)]
    reply = grpc_predict(server, "tensors", "echo", [{"value": value} for value in values])
    for value, result in zip(values, G.results_from_reply(reply), strict=True):
        if isinstance(value, np.ndarray):
            assert result["value"].dtype == value.dtype and result["value"].shape == value.shape
            np.testing.assert_array_equal(result["value"], value)
        else:
            assert result["value"] == value


def test_predict_takes_the_image_as_b64_and_the_question_typed_spoken_or_both(server, examples, vqa_package):
    """An object body and an instances list give the same answers; outputs: label str, bare float, str."""
    labels = load_meta(vqa_package[0].data.root)["answers"]
    example = examples[0]
    listed = predict(server, "vqa:predict", [rest_inputs(vqa_inputs(example, mode)) for mode in QUESTION_MODES])
    for mode, answer in zip(QUESTION_MODES, listed, strict=True):
        assert set(answer) == {"answer", "confidence", "answer_text"}
        assert answer["answer"] in labels and isinstance(answer["answer_text"], str)
        assert isinstance(answer["confidence"], float) and 0 < answer["confidence"] <= 1
        status, single = call(f"{server.rest_url}/model/vqa:predict",
                              {"instances": rest_inputs(vqa_inputs(example, mode))})
        assert status == 200 and len(single["instances"]) == 1
        assert single["instances"][0]["answer"] == answer["answer"]
        assert single["instances"][0]["confidence"] == pytest.approx(answer["confidence"], abs=FLOAT_TOLERANCE)


def test_typed_tensors_as_nested_lists_or_b64_feed_a_graph(server, examples, text_ids):
    """text_ids/text_mask given as JSON lists and as {"b64","type","shape"} reach the text_embed graph as the
    generated embed_text's tokeniser feeds it; a Python stage's float, str and bytes come back encoded."""
    question = examples[0].question
    ids, mask = text_ids(question)
    listed, packed = predict(server, "tensors:embed_ids", [
        {"text_ids": ids.tolist(), "text_mask": mask.tolist()},
        {"text_ids": typed(ids, "int32", "<i4"), "text_mask": typed(mask, "fp32", "<f4")}])
    (reference,) = predict(server, "vqa:embed_text", [{"text": question}])
    for reply in (listed, packed):
        embedding = np.asarray(reply["embedding"], np.float32)
        np.testing.assert_allclose(embedding, reference["embedding"], atol=FLOAT_TOLERANCE)
        assert reply["norm"] == pytest.approx(1.0, abs=1e-4)  # the graph's embeddings are unit length
        assert reply["summary"] == f"{len(embedding)} floats"
        assert set(reply["raw"]) == {"b64"}
        np.testing.assert_array_equal(np.frombuffer(base64.b64decode(reply["raw"]["b64"]), "<f4"), embedding)


# ----------------------------------------------------------------------------- errors

OK_BODY = {"instances": [{"text": "what shape is it"}]}
REQUEST_ERRORS = {  # name: (HTTP method, path, body, error_msg fragment, strict-mode status)
    "malformed JSON": ("POST", "/model/vqa:embed_text", b'{"instances": [',
                       "Parser request failed, Illegal JSON format", 400),
    "no instances key": ("POST", "/model/vqa:embed_text", {"instance": []},
                         "Parser request failed, key 'instances' expects to exist once, but actually 0 times", 400),
    "instances twice": ("POST", "/model/vqa:embed_text",
                        b'{"instances": [{"text": "a"}], "instances": [{"text": "b"}]}',
                        "key 'instances' expects to exist once, but actually 2 times", 400),
    "no instance": ("POST", "/model/vqa:embed_text", {"instances": []},
                    "instances value is array type, but no value", 400),
    "an empty body": ("POST", "/model/vqa:embed_text", b"", "http message invalid: the body is empty", 400),
    "wrong b64": ("POST", "/model/vqa:embed_image", {"instances": [{"image": {"b64": "no*b64"}}]},
                  "instance 0, input 'image': 'no*b64' is illegal b64 encode string", 400),
    "b64 size mismatch": ("POST", "/model/tensors:embed_ids",
                          {"instances": [{"text_ids": {**b64(bytes(6)), "type": "int32", "shape": [2]}}]},
                          "size is not matched, decode base64 size:6; Given info: type:int32; type size:4; "
                          "element nums:2", 400),
    "null value": ("POST", "/model/vqa:embed_text", {"instances": [{"text": None}]}, "json value is null", 400),
    "unknown servable": ("POST", "/model/nope:predict", OK_BODY,
                         "servable is not available: servable 'nope' is not loaded (loaded: tensors, vqa)", 404),
    "unknown method": ("POST", "/model/vqa:classify", OK_BODY, "method is not available: servable vqa version 1 has no "
                       "method 'classify' (it has embed_audio, embed_image, embed_text, predict)", 404),
    "unknown version": ("POST", "/model/vqa/version/2:embed_text", OK_BODY,
                        "servable vqa version 2 is not loaded (loaded: 1)", 404),
    "version out of range": ("POST", "/model/vqa/version/4294967295:embed_text", OK_BODY,
                             "version number range failed", 400),
    "no method in the url": ("POST", "/model/vqa", OK_BODY, "the keyword:[service method] must contain", 400),
    "a servable named ..": ("POST", "/model/..:predict", OK_BODY, "invalid servable name '..'", 400),
    "an encoded traversal": ("POST", "/model/..%2F..%2Fetc:predict", OK_BODY, "please check url", 400),
    "an unknown path": ("POST", "/v1/models/vqa:predict", OK_BODY,
                        "please check url: POST '/v1/models/vqa:predict' is not served", 404),
    "GET on /model": ("GET", "/model/vqa:predict", None, "http message only support POST right now", 405),
    "PUT on /model": ("PUT", "/model/vqa:predict", OK_BODY, "http message only support POST right now", 405),
    "GET on an admin url": ("GET", "/servables/vqa/version/1:unload", None, "please check url: GET", 404),
    "an admin url with no token configured": (  # with one: tests/serving/test_hostile.py
        "POST", "/servables/vqa/version/1:unload", None, "the admin endpoints are off; start mindvl serve with "
        "--admin-token-file PATH or --admin-token-env VAR to load and unload versions over HTTP", 403),
}


@pytest.mark.parametrize("mode", ["default", "strict"])
@pytest.mark.parametrize("case", list(REQUEST_ERRORS))
def test_a_failed_request_is_answered_with_its_error_msg(case, mode, server, strict):
    """MindSpore Serving's predict paths answer HTTP 200 with {"error_msg"}, strict mode the same body with a 4xx
    status; every other path (an admin one, an unknown one) carries its status in both modes."""
    from mindvl.serving.rest_routes import serving_protocol

    method, path, body, message, status = REQUEST_ERRORS[case]
    got_status, answer = call((server if mode == "default" else strict).rest_url + path, body, method)
    assert list(answer) == ["error_msg"] and message in answer["error_msg"]
    assert got_status == (200 if mode == "default" and serving_protocol(path) else status)


def corrupt_jpeg(png: bytes) -> bytes:
    """A real JPEG of the image, cut in half."""
    buffer = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(buffer, "JPEG")
    return buffer.getvalue()[:len(buffer.getvalue()) // 2]


def test_a_failed_instance_is_answered_in_its_place_while_the_others_succeed(server, strict, examples):
    """A missing or unknown input, a corrupt JPEG or neither question nor audio fail their own instance only;
    a partly answered request is no error, even in strict mode."""
    example = examples[0]
    good = rest_inputs(vqa_inputs(example, "typed"))
    instances = [good, {"image": good["image"], "question": example.question},
                 {**good, "image": b64(corrupt_jpeg(example.image))}, {**good, "question": "", "audio": b64(b"")},
                 {**good, "colour": "red"}, rest_inputs(vqa_inputs(example, "spoken"))]
    replies = predict(server, "vqa:predict", instances)
    assert [sorted(reply) for reply in replies] == [["answer", "answer_text", "confidence"]] + [["error_msg"]] * 4 + \
        [["answer", "answer_text", "confidence"]]
    errors = [reply["error_msg"] for reply in replies[1:5]]
    assert errors[0] == "Cannot find input audio in instance input; method predict takes image, question, audio"
    assert errors[1].startswith("Call Function 'vqa.pixels' Failed, method: 'predict', stage index(begin with 1): 1, "
                                "error msg: image: cannot decode the image")
    assert errors[2].startswith("Call Function 'vqa.question_input' Failed, method: 'predict', stage index(begin with "
                                "1): 2, error msg: predict: question and audio are both empty")
    assert errors[3] == "input 'colour' is not an input of the method; method predict takes image, question, audio"
    status, answer = call(f"{strict.rest_url}/model/vqa:predict", {"instances": instances[:3]})
    assert status == 200 and [sorted(reply) for reply in answer["instances"]] == \
        [["answer", "answer_text", "confidence"], ["error_msg"], ["error_msg"]]  # partly answered: not an error


def test_a_graph_input_of_the_wrong_dtype_or_shape_fails_its_instance(server, examples, text_ids):
    """Typed tensors are checked against the graph's inputs before batching, by size, then dtype, with MindSpore
    Serving's messages and what was given: one wrong instance cannot spoil the batch it would have joined."""
    ids, mask = text_ids(examples[0].question)
    length = len(ids)
    replies = predict(server, "tensors:embed_ids", [
        {"text_ids": ids.astype(float).tolist(), "text_mask": mask.tolist()},
        {"text_ids": ids[:5].tolist(), "text_mask": mask.tolist()},
        {"text_ids": typed(ids, "int64", "<i8"), "text_mask": mask.tolist()},
        {"text_ids": 3, "text_mask": mask.tolist()},
        {"text_ids": ids.tolist(), "text_mask": mask.tolist()}])
    given = "(graph text_embed input text_ids: given {} of shape [{}], expected int32 of shape [%d])" % length
    assert [reply.get("error_msg") for reply in replies] == [
        "Given model input 0 data type kMSI_Float32 not match the data type kMSI_Int32 defined in model "
        + given.format("float32", length),
        f"Given model input 0 size 20 not match the size {4 * length} defined in model " + given.format("int32", 5),
        f"Given model input 0 size {8 * length} not match the size {4 * length} defined in model "
        + given.format("int64", length),
        f"Given model input 0 size 4 not match the size {4 * length} defined in model " + given.format("int32", ""),
        None]


# ----------------------------------------------------------------------------- batching and gRPC

def batching_requests(examples, text_ids):
    """(path, instances) of every method for every test example, and a few multi-instance requests."""
    requests = []
    for example in examples:
        ids, mask = text_ids(example.question)
        requests += [("vqa:predict", [rest_inputs(vqa_inputs(example, mode))]) for mode in QUESTION_MODES]
        requests += [("vqa:embed_image", [{"image": b64(example.image)}]),
                     ("vqa:embed_text", [{"text": example.question}]),
                     ("vqa:embed_audio", [{"audio": b64(example.audio)}]),
                     ("tensors:embed_ids", [{"text_ids": ids.tolist(), "text_mask": mask.tolist()}])]
    requests += [("vqa:predict", [rest_inputs(vqa_inputs(example, mode)) for mode in QUESTION_MODES])
                 for example in examples[:3]]
    return requests


def largest_difference(batched, alone):
    """Strings must be equal; -> the largest absolute difference of the numeric outputs (the only bytes
    output, embed_ids' raw, holds float32s)."""
    largest = 0.0
    for got, want in zip(batched, alone, strict=True):
        assert set(got) == set(want)
        for name, value in want.items():
            if isinstance(value, str):
                assert got[name] == value, name
                continue
            if isinstance(value, dict):
                got[name], value = (np.frombuffer(base64.b64decode(raw["b64"]), "<f4") for raw in (got[name], value))
            largest = max(largest, float(np.abs(np.subtract(got[name], value, dtype=np.float64)).max()))
    return largest


def test_batched_answers_equal_the_same_requests_sent_one_at_a_time(server, strict, examples, text_ids):
    """Concurrent requests run in batches of several instances; each gets the answers an unbatched server
    gives it alone: labels and texts exactly, floats within FLOAT_TOLERANCE."""
    requests = batching_requests(examples, text_ids)
    before = metrics(server)
    with ThreadPoolExecutor(16) as pool:
        batched = list(pool.map(lambda request: predict(server, *request), requests))
    alone = [predict(strict, *request) for request in requests]
    differences = [largest_difference(got, want) for got, want in zip(batched, alone)]
    print(f"largest float difference, batched vs unbatched: {max(differences):.3g}")
    assert max(differences) <= FLOAT_TOLERANCE
    after = metrics(server)
    batches = total(after, "mindvl_batch_size_count") - total(before, "mindvl_batch_size_count")
    single = total(after, "mindvl_batch_size_bucket", le="1.0") - total(before, "mindvl_batch_size_bucket", le="1.0")
    assert batches > single  # some batch held more than one instance


def method_inputs(example, text_ids):
    """(servable, method, one instance as gRPC values) of every method for `example`."""
    ids, mask = text_ids(example.question)
    return [("vqa", "predict", vqa_inputs(example, mode)) for mode in QUESTION_MODES] + [
        ("vqa", "embed_image", {"image": example.image}), ("vqa", "embed_text", {"text": example.question}),
        ("vqa", "embed_audio", {"audio": example.audio}),
        ("tensors", "embed_ids", {"text_ids": ids, "text_mask": mask})]


def test_grpc_answers_equal_rest_answers(strict, examples, text_ids):
    """The same instance over gRPC and REST (one unbatched server): the same outputs, bit for bit."""
    for example in examples[:2]:
        for servable, method, inputs in method_inputs(example, text_ids):
            reply = grpc_predict(strict, servable, method, [inputs])
            spec = reply.servable_spec
            assert (spec.name, spec.method_name, spec.version_number) == (servable, method, 1)
            (over_grpc,) = G.results_from_reply(reply)
            (over_rest,) = predict(strict, f"{servable}:{method}", [rest_inputs(inputs)])
            assert set(over_grpc) == set(over_rest)
            for name, value in over_rest.items():
                if isinstance(value, str):
                    assert over_grpc[name] == value
                elif isinstance(value, dict):
                    assert over_grpc[name] == base64.b64decode(value["b64"])
                else:
                    np.testing.assert_array_equal(np.asarray(value, over_grpc[name].dtype), over_grpc[name])


def instance(**tensors):
    return G.Instance(items=tensors)


TEXT = G.Tensor(dtype=G.DataType.MS_STRING, bytes_val=[b"what shape is it"])
MALFORMED_GRPC = {  # name: (servable, method, version, instances, message)
    "a servable named ..": ("..", "embed_text", 0, [instance(text=TEXT)],
                            "invalid servable name '..' in servable_spec"),
    "a method with a slash": ("vqa", "a/b", 0, [instance(text=TEXT)], "invalid method name 'a/b' in servable_spec"),
    "no instance": ("vqa", "embed_text", 0, [], "Instances count of request cannot be 0, servable: vqa"),
    "data size mismatch": ("tensors", "echo", 0, [instance(value=G.Tensor(
        dtype=G.DataType.MS_INT32, shape=G.TensorShape(dims=[2]), data=bytes(6)))],
        "instance 0, input 'value': Tensor check failed: input data size 6 invalid: shape [2] of MS_INT32 needs "
        "8 bytes"),
    "an unknown dtype": ("tensors", "echo", 0, [instance(value=G.Tensor(dtype=99, data=bytes(4)))],
                         "input data type 99 invalid"),
    "two strings in one tensor": ("vqa", "embed_text", 0, [instance(text=G.Tensor(
        dtype=G.DataType.MS_STRING, bytes_val=[b"a", b"b"]))], "bytes or string type shape batch size can only be 1"),
    "an unknown servable": ("nope", "embed_text", 0, [instance(text=TEXT)], "servable is not available"),
    "an unknown version": ("vqa", "embed_text", 5, [instance(text=TEXT)], "servable vqa version 5 is not loaded"),
    "a version out of range": ("vqa", "embed_text", 2 ** 32 - 1, [instance(text=TEXT)], "version number range failed"),
}


@pytest.mark.parametrize("case", list(MALFORMED_GRPC))
def test_a_malformed_grpc_request_gets_an_error_reply(case, server):
    """A MindSpore Serving client reads an error reply (INVALID_INPUTS), never a broken call."""
    servable, method, version, instances, message = MALFORMED_GRPC[case]
    reply = grpc_raw(server, G.PredictRequest(servable_spec=G.ServableSpec(
        name=servable, method_name=method, version_number=version), instances=instances))
    assert not reply.instances and len(reply.error_msg) == 1
    assert reply.error_msg[0].error_code == G.ErrorCode.INVALID_INPUTS
    assert message in reply.error_msg[0].error_msg.decode()


def test_a_failed_grpc_instance_is_answered_in_its_place(server):
    """gRPC's layout for a partial answer: one ErrorMsg per instance, SUCCESS where it was answered."""
    reply = grpc_raw(server, G.PredictRequest(servable_spec=G.ServableSpec(name="vqa", method_name="embed_text"),
                                              instances=[instance(text=TEXT), instance(words=TEXT)]))
    answered, failed = G.results_from_reply(reply)
    assert answered["embedding"].dtype == np.float32 and answered["embedding"].ndim == 1
    assert str(failed) == "Cannot find input text in instance input; method embed_text takes text"
    assert [error.error_code for error in reply.error_msg] == [G.ErrorCode.SUCCESS, G.ErrorCode.FAILED]


# ----------------------------------------------------------------------------- status pages and metrics

def test_health_ready_and_servables_pages(server):
    """What an operator and a load balancer read: liveness, readiness and each version's status and methods."""
    assert call(f"{server.rest_url}/health", method="GET") == (200, {"status": "alive"})
    assert call(f"{server.rest_url}/ready", method="GET") == (200, {"ready": True, "not_loaded": []})
    assert call(f"{server.rest_url}/servables", method="GET") == (200, {"servables": {
        "tensors": {"default_version": 1, "versions": {"1": {"status": "loaded", "methods": ["echo", "embed_ids"]}}},
        "vqa": {"default_version": 1, "versions": {"1": {
            "status": "loaded", "methods": ["embed_audio", "embed_image", "embed_text", "predict"]}}}}})


def test_metrics_count_requests_errors_latency_and_batch_sizes(server, examples):
    """Each kind of outcome moves its own Prometheus series by exactly what was sent."""
    good = rest_inputs(vqa_inputs(examples[0], "typed"))
    before = metrics(server)
    predict(server, "vqa:predict", [good])
    predict(server, "vqa:predict", [good, {"image": good["image"]}])  # one failed instance
    call(f"{server.rest_url}/model/vqa:predict", b"{")
    call(f"{server.rest_url}/model/vqa/version/7:predict", {"instances": [good]})
    grpc_predict(server, "vqa", "predict", [vqa_inputs(examples[0], "typed")])
    after = metrics(server)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    predicts = {"servable": "vqa", "method": "predict"}
    assert delta("mindvl_requests_total", **predicts, protocol="rest", outcome="ok") == 1
    assert delta("mindvl_requests_total", **predicts, protocol="rest", outcome="partial") == 1
    assert delta("mindvl_requests_total", **predicts, protocol="grpc", outcome="ok") == 1
    assert delta("mindvl_requests_total", outcome="error") == 1  # the unknown version
    assert [delta("mindvl_errors_total", kind=kind) for kind in ("protocol", "not_found", "instance")] == [1, 1, 1]
    assert delta("mindvl_instances_total", **predicts) == 4
    assert delta("mindvl_request_latency_seconds_count", **predicts, protocol="rest") == 2
    assert delta("mindvl_request_latency_seconds_bucket", **predicts, protocol="rest", le="+Inf") == 2
    assert delta("mindvl_request_latency_seconds_count", **predicts, protocol="grpc") == 1
    graph = {"servable": "vqa", "model": "vqa"}  # predict's model stage: the vqa graph, which the failed
    assert delta("mindvl_batch_size_sum", **graph) == 3 and delta("mindvl_batch_size_count", **graph) >= 1  # missed
    assert total(after, "mindvl_loaded_versions", servable="vqa") == 1


# ----------------------------------------------------------------------------- limits

def listening(port):
    """The local addresses of the sockets listening on TCP `port`, from the kernel's tables (IPv4-mapped IPv6
    addresses as IPv4)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, port_hex = local.split(":")
                if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    ip = ipaddress.ip_address(raw)
                    found.append(getattr(ip, "ipv4_mapped", None) or ip)
    return found


def test_the_server_listens_on_loopback_only_by_default(server):
    """Nothing but this machine reaches a server started without --host, on REST or gRPC."""
    assert ServeConfig().host == "127.0.0.1"
    for port in (server.rest_port, server.grpc_port):
        assert listening(port) == [ipaddress.ip_address("127.0.0.1")]


def test_max_instances_and_max_request_mb_refuse_a_request(strict):
    """The limits refuse a request before any work is done for it: REST from a scan of the body that stops at the
    fifth instance, gRPC from the parsed message's count (its size limit is its transport's)."""
    five = [{"text": "what shape is it"}] * 5
    assert call(f"{strict.rest_url}/model/vqa:embed_text", {"instances": five}) == (400, {
        "error_msg": "Parser request failed, the request holds more than the limit of 4 instances (--max-instances)"})
    with pytest.raises(G.RequestFailed, match=r"^Parser request failed, the request holds 5 instances, more than the "
                                              r"limit of 4 \(--max-instances\)$"):
        G.results_from_reply(grpc_predict(strict, "vqa", "embed_text", five))
    assert len(predict(strict, "vqa:embed_text", five[:4])) == 4  # at the limit: answered

    big = {"instances": [{"text": "a" * 600_000}]}
    assert call(f"{strict.rest_url}/model/vqa:embed_text", big) == (413, {
        "error_msg": "request body exceeds 0.5 MB (--max-request-mb)"})
    with pytest.raises(grpc.RpcError) as refused:
        grpc_predict(strict, "vqa", "embed_text", big["instances"])
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("settings, message", [
    ({"header_timeout_s": 0.0}, "header_timeout_s: expected a number > 0, got 0.0"),
    ({"keepalive_s": -1.0}, "keepalive_s: expected a number > 0, got -1.0"),
    ({"max_connections": 0}, "max_connections: expected an integer >= 1, got 0"),
    ({"decode_slots": 0}, "decode_slots: expected an integer >= 1, got 0"),
    ({"max_inflight_mb": 16.0, "max_request_mb": 32.0},
     "max_inflight_mb: 16 is less than max_request_mb 32, so a body of the largest size could never be served; raise "
     "--max-inflight-mb or lower --max-request-mb"),
])
def test_a_limit_out_of_range_is_refused_naming_it(settings, message, tmp_path, capsys):
    """ServeConfig refuses it; `mindvl serve` says so in one line and exits 2."""
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        ServeConfig(servable_dir=str(tmp_path), **settings).validate()
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in settings.items()]
    assert main(["serve", "--servable-dir", str(tmp_path), *flags]) == 2
    assert capsys.readouterr().err == f"mindvl: error: {message}\n"


def _raw_request(server, head: bytes, body: bytes = b"") -> bytes:
    """Send `head` (and `body`) on a fresh socket; -> the reply's bytes up to its status line's end."""
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=20) as connection:
        connection.sendall(head + body)
        reply = b""
        while b"\r\n" not in reply:
            chunk = connection.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply


def test_a_body_too_large_by_its_header_or_not_what_its_encoding_says_is_refused_and_counted(strict):
    """A Content-Length past --max-request-mb is answered before any of the body is sent (a client that
    never sends it does not hold the handler); a body labelled gzip that is not gzip is a protocol error."""
    before = metrics(strict)
    head = (b"POST /model/vqa:embed_text HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n")
    assert _raw_request(strict, head).startswith(b"HTTP/1.1 413")
    garbage = b'{"instances": [{"text": "hi"}]}'
    head = (b"POST /model/vqa:embed_text HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: gzip\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(garbage))
    reply = _raw_request(strict, head, garbage)
    assert reply.startswith(b"HTTP/1.1 400")
    status, answer = call(f"{strict.rest_url}/model/vqa:embed_text", garbage, headers={"Content-Encoding": "gzip"})
    assert status == 400 and answer["error_msg"].startswith("Parser request failed, the body is not valid "
                                                            "Content-Encoding gzip")
    after = metrics(strict)
    assert total(after, "mindvl_errors_total", kind="too_large") - total(before, "mindvl_errors_total",
                                                                         kind="too_large") == 1
    assert total(after, "mindvl_errors_total", kind="protocol") - total(before, "mindvl_errors_total",
                                                                        kind="protocol") == 2
    assert total(after, "mindvl_errors_total", kind="internal") == total(before, "mindvl_errors_total",
                                                                         kind="internal")


def test_a_request_past_timeout_s_gets_a_timeout_error(servables, examples):
    """A request that outlives --timeout-s is answered (504 in strict mode) and counted, over both protocols. The
    graphs are held (the graph lock) so that the request outlives it on any machine, its body read in time (a
    timeout of 0.1 ms let a loaded machine's body read time out first: 408)."""
    with BackgroundServer(config(servables, strict_http=True, batching=False, timeout_s=0.5)) as hasty:
        with GRAPH_LOCK:
            status, answer = call(f"{hasty.rest_url}/model/vqa:predict",
                                  {"instances": [rest_inputs(vqa_inputs(examples[0], "both"))]})
            reply = grpc_predict(hasty, "vqa", "predict", [vqa_inputs(examples[0], "both")])
        counted = metrics(hasty)
    assert (status, answer) == (504, {"error_msg": "request timed out after 0.5 s (--timeout-s)"})
    with pytest.raises(G.RequestFailed, match=r"request timed out after 0\.5 s"):
        G.results_from_reply(reply)
    assert total(counted, "mindvl_errors_total", kind="timeout") == 2
