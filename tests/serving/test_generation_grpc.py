"""MSService/PredictStream, the server-streaming rpc of a generative servable's `generate`, served live on 127.0.0.1:
its replies concatenate to the unary answer, a refused request gets its gRPC status and the server goes on, a client
that cancels cancels its generation, and mindvl's Client streams over gRPC and REST. Its messages' codec first."""
import time

import grpc
import numpy as np
import pytest
from live import call, grpc_predict, metrics, total

from mindvl.data.reading.examples import query_examples
from mindvl.serving import Client, ServingError
from mindvl.serving import grpc_protocol as G
from mindvl.serving.protocol import ProtocolError
from mindvl.serving.runtime import GRAPH_LOCK

GREEDY = {"max_tokens": 12}
WAIT_S = 60  # the longest a test waits for the server to notice something (it takes milliseconds)


@pytest.fixture(scope="module")
def server(generative_server):
    """The session's server of `vlm` (generative) and `vqa` (not), in one servable directory."""
    return generative_server


@pytest.fixture(scope="module")
def examples(generative_package):
    return query_examples(generative_package[0].data.root)[:2]


def typed(example, **settings):
    return {"image": example.image, "text": example.question, **GREEDY, **settings}


def spoken(example, **settings):
    return {"image": example.image, "audio": example.audio, **GREEDY, **settings}


def stream(server, instance, servable="vlm", method="generate", version=0):
    """The PredictReply messages of a PredictStream call."""
    with grpc.insecure_channel(server.grpc_target) as channel:
        return list(G.predict_stream_stub(channel)(G.instances_to_request(servable, method, version, [instance]),
                                                   timeout=120))


def unary(server, instance):
    """The outputs of a unary Predict of `generate`."""
    [result] = G.results_from_reply(grpc_predict(server, "vlm", "generate", [instance]))
    return result


def engine(server):
    return server.catalog.get("vlm", 0).batcher


def wait_until(condition) -> bool:
    """Whether `condition()` came true within WAIT_S (checked every 10 ms)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def disconnects(server) -> float:
    return total(metrics(server), "mindvl_errors_total", kind="disconnected")


# ---- messages ----------------------------------------------------------------------------------------

def test_a_stream_reply_carries_text_an_int32_token_a_float32_logprob_and_the_finish_reason():
    spec = G.ServableSpec(name="vlm", method_name="generate", version_number=2)
    reply = G.PredictReply.FromString(G.stream_reply(spec, "ci", 17, -0.25, None).SerializeToString())
    items = reply.instances[0].items
    assert (items["token"].dtype, list(items["token"].shape.dims)) == (G.DataType.MS_INT32, [])
    assert (items["logprob"].dtype, list(items["logprob"].shape.dims)) == (G.DataType.MS_FLOAT32, [])
    assert reply.servable_spec == spec
    assert G.delta_from_reply(reply) == {"text": "ci", "token": 17, "logprob": -0.25, "finish_reason": ""}
    last = G.delta_from_reply(G.stream_reply(spec, "", 2, -1.5, "stop"))
    assert last["finish_reason"] == "stop"


@pytest.mark.parametrize("reply, problem", [
    (G.PredictReply(), "holds 0 instances"),
    (G.reply_from_error(G.ServableSpec(), ProtocolError("no")), "error_msg"),
    (G.reply_from_results(G.ServableSpec(), [{"text": "a"}]), "holds outputs ['text']"),
    (G.reply_from_results(G.ServableSpec(), [{"text": "a", "token": np.float32(1), "logprob": np.float32(0),
                                              "finish_reason": ""}]), "token an integer scalar"),
    (G.reply_from_results(G.ServableSpec(), [{"text": b"a", "token": np.int32(1), "logprob": np.float32(0),
                                              "finish_reason": ""}]), "text and finish_reason strings"),
], ids=["empty", "an error", "outputs missing", "a float token", "bytes text"])
def test_a_reply_that_is_not_a_delta_is_refused_by_what_it_holds(reply, problem):
    with pytest.raises(ProtocolError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        G.delta_from_reply(reply)


def test_more_than_one_instance_is_refused_before_a_tensor_is_decoded():
    request = G.instances_to_request("vlm", "generate", 0, [{"text": "a"}, {"text": "b"}])
    request.instances[1].items["text"].bytes_val.append(b"a second item: undecodable")
    with pytest.raises(ProtocolError, match="PredictStream streams one instance, got 2"):
        G.stream_request_to_instance(request)
    assert G.stream_request_to_instance(G.instances_to_request("vlm", "generate", 3, [{"text": "a"}])) == \
        ("vlm", "generate", 3, {"text": "a"})


# ---- the live server ----------------------------------------------------------------------------------

@pytest.mark.parametrize("question", [typed, spoken])
def test_streamed_replies_concatenate_to_the_unary_answer(server, examples, question):
    instance = question(examples[0])
    answer = unary(server, instance)
    replies = stream(server, instance)
    deltas = [G.delta_from_reply(reply) for reply in replies]
    assert "".join(d["text"] for d in deltas) == answer["text"]
    assert [d["token"] for d in deltas] == answer["tokens"].tolist()
    assert [d["finish_reason"] for d in deltas] == [""] * (len(deltas) - 1) + [answer["finish_reason"]]
    assert np.mean([d["logprob"] for d in deltas]) == pytest.approx(float(answer["mean_logprob"]), abs=1e-5)
    assert {(r.servable_spec.name, r.servable_spec.method_name, r.servable_spec.version_number) for r in replies} \
        == {("vlm", "generate", 1)}


@pytest.mark.parametrize("servable, method, version, instances, code, message", [
    ("nope", "generate", 0, [{"text": "a"}], "NOT_FOUND", "servable 'nope' is not loaded"),
    ("vlm", "generate", 7, [{"text": "a"}], "NOT_FOUND", "servable vlm version 7 is not loaded"),
    ("vqa", "generate", 0, [{"text": "a"}], "INVALID_ARGUMENT", "servable vqa does not generate (it has "),
    ("vlm", "predict", 0, [{"text": "a"}], "INVALID_ARGUMENT", "PredictStream streams method generate, not predict"),
    ("vlm", "generate", 0, [{"text": "a"}, {"text": "b"}], "INVALID_ARGUMENT", "streams one instance, got 2"),
    ("vlm", "generate", 0, [], "INVALID_ARGUMENT", "Instances count of request cannot be 0"),
    ("vlm", "generate", 0, [{"text": "a", "top_p": 3.0}], "INVALID_ARGUMENT", "top_p: expected a value in"),
    ("vlm", "generate", 0, [{"text": "a", "max_tokens": 100000}], "INVALID_ARGUMENT",
     "max_tokens: 100000 asked, this model generates at most"),
    ("vlm", "generate", 0, [{"question": "a"}], "INVALID_ARGUMENT", "input 'question' is not an input"),
], ids=["unknown servable", "unknown version", "not generative", "another method", "two instances",
        "no instance", "bad setting", "too many tokens", "unknown input"])
def test_a_refused_stream_gets_its_grpc_status_and_the_server_stays_up(server, servable, method, version,
                                                                        instances, code, message):
    request = G.instances_to_request(servable, method, version, instances)
    with grpc.insecure_channel(server.grpc_target) as channel:
        replies = G.predict_stream_stub(channel)(request, timeout=120)
        with pytest.raises(grpc.RpcError) as raised:
            next(replies)
    assert raised.value.code() == getattr(grpc.StatusCode, code)
    assert message in raised.value.details()
    assert call(f"{server.rest_url}/health", method="GET")[0] == 200
    assert G.delta_from_reply(stream(server, {"text": "What shape is it?", "max_tokens": 1})[-1])["finish_reason"]


def test_a_client_that_cancels_mid_stream_cancels_its_generation(server):
    """The engine is held (the graph lock) while the client waits for the stream's headers (sent once the
    generation is queued) and cancels; the server counts the disconnect and cancels the generation, which the
    engine, let go, drops before its first token."""
    cancelled, gone = engine(server).cancelled, disconnects(server)
    request = G.instances_to_request("vlm", "generate", 0, [{"text": "What color is the shape?", "max_tokens": 64,
                                                             "temperature": 1.5, "seed": 3}])
    with grpc.insecure_channel(server.grpc_target) as channel:
        with GRAPH_LOCK:
            replies = G.predict_stream_stub(channel)(request, timeout=120)
            replies.initial_metadata()  # the generation is queued
            replies.cancel()
            assert wait_until(lambda: disconnects(server) == gone + 1)
        assert replies.code() == grpc.StatusCode.CANCELLED
    assert wait_until(lambda: engine(server).cancelled > cancelled and not engine(server).batch.rows)
    assert engine(server).cancelled == cancelled + 1


@pytest.mark.parametrize("address", ["grpc_target", "rest_url"])
def test_the_client_streams_the_deltas_of_its_answer(server, examples, address):
    instance = typed(examples[1])
    with Client(getattr(server, address), "vlm", "generate") as client:
        [answer] = client.infer(instance)
        deltas = list(client.stream(instance))
        assert "".join(d["text"] for d in deltas) == answer["text"]
        assert [d["token"] for d in deltas] == answer["tokens"].tolist()
        assert [d["finish_reason"] for d in deltas] == [""] * (len(deltas) - 1) + [answer["finish_reason"]]
        assert all(isinstance(d["logprob"], float) and d["logprob"] <= 0 for d in deltas)
        with pytest.raises(ServingError, match="top_p: expected a value in"):
            list(client.stream({"text": "What shape is it?", "top_p": 3.0}))
    with Client(getattr(server, address), "vqa", "predict") as other, \
            pytest.raises(ServingError, match="only method generate streams; this client calls vqa.predict"):
        other.stream({"question": "What shape is it?"})
