"""mindvl.serving.Client against a live server: REST and gRPC decode the same outputs for the same inputs, a
failed instance is {"error": ...} in its place, and a refused or unreachable request raises ServingError.
The value codec is checked against the server's own parser and encoders."""
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from mindvl.data import load_meta
from mindvl.data.reading.examples import query_examples
from mindvl.serving import Client, ServingError
from mindvl.serving import grpc_protocol as G
from mindvl.serving.client import _grpc_output, _rest_output, rest_value
from mindvl.serving.protocol import encode_reply, parse_request
from mindvl.serving.server import BackgroundServer

from live import config


@pytest.fixture(scope="module")
def samples(vqa_package):
    """(PNG bytes, typed question, the same question spoken as WAV bytes) of two test examples."""
    return [(e.image, e.question, e.audio) for e in query_examples(vqa_package[0].data.root, 2)]


@pytest.fixture(scope="module")
def clients(live_server):
    """clients(method, **options) -> {"rest": Client, "grpc": Client} for that method of the live server's vqa."""
    addresses = {"rest": live_server.rest_url, "grpc": live_server.grpc_target}
    return lambda method, **kw: {kind: Client(address, "vqa", method, **kw) for kind, address in addresses.items()}


def assert_same_results(first, second):
    """Equal outputs with equal types: arrays equal in dtype, shape and value, scalars and text equal."""
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.keys() == b.keys()
        for name in a:
            assert type(a[name]) is type(b[name]), name
            if isinstance(a[name], np.ndarray):
                assert a[name].dtype == b[name].dtype, name
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
            else:
                assert a[name] == b[name], name


def test_predict_answers_typed_and_spoken_questions_alike_over_rest_and_grpc(clients, samples, vqa_package):
    """Text, speech and both, in one request: each gets a label, its probability and the generated text, and
    the two protocols decode identical values."""
    labels = load_meta(vqa_package[0].data.root)["answers"]
    instances = [{"image": image, "question": question, "audio": b""} for image, question, _ in samples]
    instances += [{"image": image, "question": "", "audio": audio} for image, _, audio in samples]
    instances.append({"image": samples[0][0], "question": samples[0][1], "audio": samples[0][2]})
    results = {}
    for kind, client in clients("predict").items():
        with client:
            results[kind] = client.infer(instances)
    assert_same_results(results["rest"], results["grpc"])
    for result in results["rest"]:
        assert result["answer"] in labels and isinstance(result["answer_text"], str)
        assert isinstance(result["confidence"], float) and 0 < result["confidence"] <= 1


def test_embeddings_are_unit_float32_vectors_equal_over_both_protocols(clients, samples, vqa_package):
    embed_dim = vqa_package[0].model.embed_dim
    image, question, audio = samples[0]
    for method, inputs in (("embed_image", {"image": image}), ("embed_text", {"text": question}),
                           ("embed_audio", {"audio": audio})):
        results = {kind: client.infer(inputs) for kind, client in clients(method).items()}
        assert_same_results(results["rest"], results["grpc"])
        embedding = results["grpc"][0]["embedding"]
        assert embedding.dtype == np.float32 and embedding.shape == (embed_dim,), method
        assert np.linalg.norm(embedding) == pytest.approx(1.0, abs=1e-4), method


def test_a_failed_instance_is_an_error_in_its_place_and_the_others_are_answered(clients, samples):
    image = samples[0][0]
    for kind, client in clients("embed_image").items():
        alone = client.infer({"image": image})[0]["embedding"]
        first, broken, last = client.infer([{"image": image}, {"image": b"not an image"}, {"image": image}])
        assert list(broken) == ["error"] and "cannot decode the image" in broken["error"], kind
        np.testing.assert_allclose(first["embedding"], alone, atol=1e-6, err_msg=kind)
        np.testing.assert_allclose(last["embedding"], alone, atol=1e-6, err_msg=kind)


def test_a_request_the_server_refuses_raises_serving_error_with_its_message(live_server, samples):
    """The server's error_msg, over both protocols: an unknown method, an unloaded version, a pinned one works."""
    for address in (live_server.rest_url, live_server.grpc_target):
        with pytest.raises(ServingError, match="method is not available: servable vqa version 1 has no method 'nope'"):
            Client(address, "vqa", "nope").infer({"image": samples[0][0]})
        with pytest.raises(ServingError, match="servable vqa version 7 is not loaded"):
            Client(address, "vqa", "embed_text", version_number=7).infer({"text": "what shape"})
        assert Client(address, "vqa", "embed_text", version_number=1).infer({"text": "what shape"})[0]["embedding"].size


def test_an_http_error_status_carries_the_servers_message_or_says_the_address_is_wrong(tmp_path):
    """Strict mode answers errors with 4xx/5xx and error_msg in the body; a server that is no serving endpoint
    (here Python's http.server, which has no POST) is named as such."""
    with BackgroundServer(config(tmp_path, strict_http=True)) as server:  # an empty servable directory
        with pytest.raises(ServingError, match="servable is not available: servable 'vqa' is not loaded"):
            Client(server.rest_url, "vqa", "predict").infer({"question": "what?"})
    other = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ServingError, match="HTTP 501 Unsupported method .*; is this the REST address of"):
            Client(f"http://127.0.0.1:{other.server_port}", "vqa", "predict").infer({"question": "what?"})
    finally:
        other.shutdown()
        other.server_close()


def test_an_unreachable_server_raises_serving_error_naming_the_address_and_the_fix():
    with socket.socket() as sock:  # bound, not listening: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        for address in (f"http://127.0.0.1:{port}", f"grpc://127.0.0.1:{port}", f"127.0.0.1:{port}"):
            with pytest.raises(ServingError, match=rf"cannot reach .*127\.0\.0\.1:{port}.*is `mindvl serve` running"):
                Client(address, "vqa", "predict", timeout=5).infer({"text": "x"})


def test_bad_addresses_names_and_inputs_are_refused_before_sending():
    with pytest.raises(ServingError, match="scheme 'ftp' is not served"):
        Client("ftp://127.0.0.1:1", "vqa", "predict")
    with pytest.raises(ServingError, match="expected http://host:port"):
        Client("localhost", "vqa", "predict")  # gRPC needs a port
    with pytest.raises(ServingError, match="servable_name '../x'"):
        Client("http://127.0.0.1:1", "../x", "predict")
    with pytest.raises(ServingError, match=r"instance 0, input 'x': type dict cannot be sent"):
        Client("http://127.0.0.1:1", "vqa", "predict").infer({"x": {}})
    with pytest.raises(ServingError, match="expected a dict of input values"):
        Client("http://127.0.0.1:1", "vqa", "predict").infer([])


def test_rest_inputs_encode_to_what_the_server_parses_with_their_dtypes():
    values = {"tensor": np.arange(6, dtype=np.int64).reshape(2, 3), "half": np.float16(1.5),
              "flags": np.array([True, False]), "big_endian": np.array([1.25, -2.0], ">f8"),
              "raw": b"\x00\xffbytes", "text": np.str_("what shape?"), "number": 3, "ratio": 0.5,
              "rows": [[1, 2], [3, 4]]}
    parsed, = parse_request(json.dumps({"instances": [{k: rest_value(v) for k, v in values.items()}]}).encode(), 1)
    for name in ("tensor", "half", "flags", "big_endian"):
        expected = np.asarray(values[name])
        assert parsed[name].dtype == expected.dtype.newbyteorder("=") and parsed[name].shape == expected.shape
        np.testing.assert_array_equal(parsed[name], expected)
    assert (parsed["raw"], parsed["text"]) == (values["raw"], values["text"])
    assert (parsed["number"].dtype, parsed["ratio"].dtype, parsed["rows"].dtype) == (np.int32, np.float32, np.int32)
    assert parsed["rows"].tolist() == values["rows"]


def test_rest_replies_decode_like_grpc_replies_and_keep_every_value():
    """Float32 and int32 outputs come back in their dtype over JSON; values float32 or int32 cannot hold keep
    float64 / int64; nan survives (the server sends null); bytes, str and 0-d tensors match gRPC's."""
    outputs = {"embedding": np.array([0.1, -2.5, 3e-8], np.float32), "ids": np.array([[1, 2], [3, 4]], np.int32),
               "precise": np.array([0.1, 1e300]), "large": np.array([2 ** 40], np.int64),
               "gaps": np.array([np.nan, 1.0], np.float32), "mask": np.array([True, False]),
               "score": np.float32(0.75), "count": np.int32(4), "label": "circle", "raw": b"\x01\x02"}
    rest = {name: _rest_output(value) for name, value in json.loads(encode_reply([outputs]))["instances"][0].items()}
    grpc = {name: _grpc_output(value) for name, value in G.results_from_reply(
        G.reply_from_results(G.ServableSpec(), [outputs]))[0].items()}
    assert_same_results([rest], [grpc])  # nan equals nan here
    assert np.isnan(rest["gaps"][0]) and rest["embedding"].dtype == np.float32
    assert rest["precise"].dtype == np.float64 and rest["large"].dtype == np.int64
