"""A generative package served live on 127.0.0.1: `generate` over REST, Server-Sent Events, continuous batching
(concurrent requests share decode steps and get what they get alone), the OpenAI chat API through the real
`openai` client (an image, a spoken question, streaming with usage), OpenAI-style errors, and a client that
goes away cancelling its generation."""
import base64
import concurrent.futures
import http.client
import json
import time

import openai
import pytest
from live import b64, call

from mindvl.data.reading.examples import query_examples
from mindvl.serving.runtime import GRAPH_LOCK

GREEDY = {"max_tokens": 12}


@pytest.fixture(scope="module")
def server(generative_server):
    """The session's server of `vlm` (and `vqa`), continuous batching up to 8 streams."""
    return generative_server


@pytest.fixture(scope="module")
def examples(generative_package):
    return query_examples(generative_package[0].data.root)[:6]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.rest_url}/v1", api_key="unused", max_retries=0, timeout=120)


def engine(server):
    return server.catalog.get("vlm", 0).batcher


def generate(server, instance):
    status, answer = call(f"{server.rest_url}/model/vlm:generate", {"instances": [instance]})
    assert status == 200, answer
    return answer["instances"][0]


def typed(example):
    return {"image": b64(example.image), "text": example.question, **GREEDY}


def spoken(example):
    return {"image": b64(example.image), "audio": b64(example.audio), **GREEDY}


def events(server, instance):
    """The Server-Sent Events of a streamed generate, decoded."""
    connection = http.client.HTTPConnection("127.0.0.1", int(server.rest_url.rsplit(":", 1)[1]), timeout=120)
    connection.request("POST", "/model/vlm:generate", json.dumps({"instances": [instance]}),
                       {"Accept": "text/event-stream", "Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.getheader("Content-Type").startswith("text/event-stream")
    lines = [line for line in response.read().decode().split("\n\n") if line]
    connection.close()
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def test_concurrent_requests_share_decode_steps_and_get_their_answers_alone(server, examples):
    instances = [typed(e) for e in examples[:3]] + [spoken(e) for e in examples[:3]]
    alone = [generate(server, instance) for instance in instances]
    assert all(a["text"] and a["finish_reason"] in ("stop", "length") for a in alone), alone
    assert any(a["prompt_tokens"] != alone[0]["prompt_tokens"] for a in alone)  # different prompt buckets
    steps = engine(server).steps
    with concurrent.futures.ThreadPoolExecutor(len(instances)) as pool:
        together = list(pool.map(lambda instance: generate(server, instance), instances))
    assert [t["tokens"] for t in together] == [a["tokens"] for a in alone]
    assert [t["text"] for t in together] == [a["text"] for a in alone]
    # requests joined the running batch: fewer decode calls than the tokens generated
    assert engine(server).steps - steps < sum(len(a["tokens"]) for a in alone)
    assert not engine(server).batch.rows  # every finished request freed its cache rows


def test_streamed_events_concatenate_to_the_answer(server, examples):
    instance = typed(examples[0])
    answer = generate(server, instance)
    streamed = events(server, instance)
    assert "".join(e["text"] for e in streamed) == answer["text"]
    assert [e["token"] for e in streamed] == answer["tokens"]
    assert streamed[-1]["finish_reason"] == answer["finish_reason"]


def test_the_openai_client_asks_about_an_image_typed_and_spoken(server, client, examples):
    assert "vlm" in [model.id for model in client.models.list()]
    example = examples[0]
    image = {"type": "image_url",
             "image_url": {"url": "data:image/png;base64," + base64.b64encode(example.image).decode()}}
    typed_answer = client.chat.completions.create(model="vlm", max_tokens=12, messages=[
        {"role": "system", "content": "You answer questions about images."},
        {"role": "user", "content": [image, {"type": "text", "text": example.question}]}])
    assert typed_answer.choices[0].message.content == generate(server, typed(example))["text"]
    assert typed_answer.usage.completion_tokens > 0 and typed_answer.usage.prompt_tokens > 16
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(example.audio).decode(), "format": "wav"}}
    spoken_answer = client.chat.completions.create(model="vlm", max_tokens=12,
                                                   messages=[{"role": "user", "content": [image, audio]}])
    assert spoken_answer.choices[0].message.content == generate(server, spoken(example))["text"]
    chunks = list(client.chat.completions.create(model="vlm", max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": [image, audio]}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == spoken_answer.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [spoken_answer.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == spoken_answer.usage.completion_tokens


@pytest.mark.parametrize("content, code", [
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}, {"type": "text", "text": "Color?"}],
     "missing_image_data"),
    ([{"type": "file", "file": {"file_data": "AAAA"}}], "unsupported_content_part"),
    ([{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}], "invalid_value"),  # no video here
    ([{"type": "image_url", "image_url": {"url": "data:image/png,notbase64"}}], "invalid_data_url"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}], "invalid_base64"),
    ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}], "remote_url_refused"),
])
def test_bad_requests_get_openai_errors_and_the_server_stays_up(server, client, content, code):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="vlm", messages=[{"role": "user", "content": content}])
    assert raised.value.code == code, raised.value
    assert call(f"{server.rest_url}/health", method="GET")[0] == 200


def test_too_many_tokens_an_unknown_model_and_a_bad_setting_are_refused_by_name(server, client, examples):
    messages = [{"role": "user", "content": "What shape is it?"}]
    with pytest.raises(openai.BadRequestError, match="max_tokens: 100000 asked, this model generates at most 64"):
        client.chat.completions.create(model="vlm", max_tokens=100000, messages=messages)
    with pytest.raises(openai.NotFoundError, match="The model 'gpt-4o' does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=messages)
    with pytest.raises(openai.BadRequestError, match="top_p: expected a value in"):
        client.chat.completions.create(model="vlm", top_p=3.0, messages=messages)
    with pytest.raises(openai.BadRequestError, match="no question"):
        client.chat.completions.create(model="vlm", messages=[{"role": "user", "content": ""}])
    with pytest.raises(openai.BadRequestError, match="n: only 1"):
        client.chat.completions.create(model="vlm", n=2, messages=messages)
    with pytest.raises(openai.BadRequestError, match="temperature: expected a value in"):
        client.chat.completions.create(model="vlm", temperature=7.5, messages=messages)
    answer = client.chat.completions.create(model="vlm", max_tokens=3, messages=messages)  # text only: still works
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.usage.completion_tokens <= 3


@pytest.mark.parametrize("fields, param", [
    ({"logprobs": True, "top_logprobs": 2}, "logprobs"), ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"presence_penalty": 0.5}, "presence_penalty"), ({"extra_body": {"guided_choice": ["yes", "no"]}}, "guided_choice"),
    ({"extra_body": {"best_of": 3}}, "best_of")])
def test_a_field_the_server_would_ignore_is_refused_by_name(client, fields, param):
    """Nothing silently ignored: the client reads a 400 whose param names the field, never an answer that looks as
    if it had been honoured; the value that asks for nothing passes."""
    messages = [{"role": "user", "content": "What shape is it?"}]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="vlm", max_tokens=2, messages=messages, **fields)
    assert raised.value.body["param"] == param and param in str(raised.value)
    answer = client.chat.completions.create(model="vlm", max_tokens=2, messages=messages, logprobs=False,
                                            presence_penalty=0, response_format={"type": "text"}, user="u1")
    assert answer.usage.completion_tokens <= 2


def test_a_client_that_goes_away_cancels_its_generation(server):
    """The engine is held (the graph lock) while the client reads the first chunk and leaves; the server sees the
    connection close and cancels the request, which the engine, let go, drops before its first token."""
    before = engine(server).cancelled
    port = int(server.rest_url.rsplit(":", 1)[1])
    body = {"model": "vlm", "stream": True, "max_tokens": 64, "temperature": 1.5, "seed": 3,
            "messages": [{"role": "user", "content": "What color is the shape?"}]}
    with GRAPH_LOCK:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.read1(65536).startswith(b"data: ")  # the role chunk
        connection.sock.close()
        connection.close()
        time.sleep(0.5)  # the server notices within WATCH_S
    for _ in range(200):
        if engine(server).cancelled > before and not engine(server).batch.rows:
            break
        time.sleep(0.05)
    assert engine(server).cancelled == before + 1
    assert not engine(server).batch.rows
