"""A generative package served live on 127.0.0.1: `generate` over REST, Server-Sent Events, continuous batching
(concurrent requests share decode steps and get what they get alone), the OpenAI chat API through the real
`openai` client (an image, a spoken question, streaming with usage, whole conversations and their truncation,
logprobs, n, penalties, embeddings), OpenAI-style errors, and a client that goes away cancelling its
generation."""
import base64
import concurrent.futures
import http.client
import json
import time

import openai
import pytest
from live import b64, call

from mindvl.data.reading.examples import query_examples
from mindvl.serving.continuous_batching import GenerationOptions, request_settings
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


def _queued(server, count):
    """Wait until `count` requests wait in the engine's queue."""
    for _ in range(600):
        if engine(server).waiting.qsize() == count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{engine(server).waiting.qsize()} requests queued, expected {count}")


def test_waiting_requests_prefill_together_and_a_failing_one_fails_alone(server, examples, monkeypatch):
    """Requests waiting together prefill in one call (PREFILL_TOKENS); when that call fails because of one of
    them, the others are prefilled alone and get their answers, and only that one gets the error. The engine is
    held (the graph lock) on a first request while the four queue."""
    batcher = engine(server)
    instances = [typed(e) for e in examples[:4]]
    alone = [generate(server, instance) for instance in instances[:3]]
    rendered = batcher.layout.encode(batcher.prepare(examples[3].question, examples[3].image, None,
                                                     request_settings(GREEDY)))
    poison = list(rendered.ids[rendered.kinds == 0])  # its text ids, as a PromptBatch's `encoded` holds them
    real, calls = batcher.batch.graphs.prefill, []

    def prefill(batch):
        poisoned = any(list(ids) == poison for ids in batch.encoded)
        calls.append((len(batch.ids), poisoned))
        if poisoned:
            raise RuntimeError("the prefill broke on this prompt")
        return real(batch)

    monkeypatch.setattr(batcher.batch.graphs, "prefill", prefill)
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        with GRAPH_LOCK:
            first = pool.submit(generate, server, instances[0])
            _queued(server, 0)  # the engine took it and waits for the lock
            time.sleep(0.2)
            answers = [pool.submit(call, f"{server.rest_url}/model/vlm:generate", {"instances": [i]})
                       for i in instances]
            _queued(server, 4)
        answers = [a.result() for a in answers]
        first.result()
    assert (4, True) in calls and (1, True) in calls  # together first, then each alone
    assert [status for status, _ in answers[:3]] == [200] * 3, answers
    assert [answer["instances"][0]["tokens"] for _, answer in answers[:3]] == [a["tokens"] for a in alone]
    assert "the prefill broke on this prompt" in json.dumps(answers[3][1])


def test_requests_reaching_an_idle_engine_within_max_wait_ms_prefill_together(server, examples, monkeypatch):
    """An idle engine that takes a request waits up to max_wait_ms (mindvl serve --max-wait-ms) for others to prefill
    with it: three requests sent 100 ms apart under a 1 s window prefill in one call (3 rows padded to 4), and
    their answers are theirs alone."""
    batcher = engine(server)
    instances = [typed(e) for e in examples[:3]]
    alone = [generate(server, instance) for instance in instances]
    monkeypatch.setattr(batcher, "options", GenerationOptions(max_wait_ms=1000))
    real, calls = batcher.batch.graphs.prefill, []
    monkeypatch.setattr(batcher.batch.graphs, "prefill", lambda batch: calls.append(len(batch.ids)) or real(batch))
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        sent = []
        for instance in instances:
            sent.append(pool.submit(generate, server, instance))
            time.sleep(0.1)
        together = [future.result() for future in sent]
    assert calls == [4]
    assert [t["tokens"] for t in together] == [a["tokens"] for a in alone]


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


def image_part(example):
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(example.image).decode()}}


def test_the_whole_conversation_is_read_its_image_in_an_earlier_turn(server, client, examples):
    """A chat client sends the history on every request: the model reads it (prompt_tokens, the logits and a sampled
    answer change), an image sent in an earlier turn is still the one the question is about, and REST `generate`
    with the same `history` gets the same tokens."""
    example = next(e for e in examples if "color" in e.question)
    first = [{"role": "user", "content": [image_part(example), {"type": "text", "text": "Look at this picture."}]}]
    alone = client.chat.completions.create(model="vlm", max_tokens=12, messages=first)
    follow_up = example.question
    chat = first + [{"role": "assistant", "content": alone.choices[0].message.content},
                    {"role": "user", "content": follow_up}]
    answer = client.chat.completions.create(model="vlm", max_tokens=12, messages=chat)
    just_last = client.chat.completions.create(model="vlm", max_tokens=12, messages=chat[-1:])
    assert answer.usage.prompt_tokens > alone.usage.prompt_tokens > just_last.usage.prompt_tokens
    assert answer.model_extra["dropped_turns"] == 0
    history = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Look at this picture."}]},
               {"role": "assistant", "content": alone.choices[0].message.content}]
    rest = generate(server, {"image": b64(example.image), "text": follow_up, "history": json.dumps(history), **GREEDY})
    assert rest["text"] == answer.choices[0].message.content and rest["prompt_tokens"] == answer.usage.prompt_tokens
    unseen = [{"role": "user", "content": "Look at this picture."}, history[1]]
    without_image = generate(server, {"text": follow_up, "history": json.dumps(unseen), **GREEDY})
    assert without_image["prompt_tokens"] < rest["prompt_tokens"]  # the image's slots are in the prompt
    # the tiny untrained model says the same word whatever it reads; its confidence in it shows what it read
    alone_rest = generate(server, {"text": follow_up, **GREEDY})
    assert alone_rest["text"] == just_last.choices[0].message.content
    confidences = {round(float(a["mean_logprob"]), 5) for a in (rest, without_image, alone_rest)}
    assert len(confidences) == 3, "the history changed nothing the model computed"
    # sampled with one seed, the answer itself changes with the history
    sampled = {"model": "vlm", "max_tokens": 12, "temperature": 1.0, "seed": 7, "extra_body": {"ignore_eos": True}}
    assert client.chat.completions.create(messages=chat, **sampled).choices[0].message.content != \
        client.chat.completions.create(messages=chat[-1:], **sampled).choices[0].message.content


def test_a_conversation_longer_than_the_prompt_leaves_out_its_oldest_exchanges(server, client, examples):
    """Past the largest bucket the oldest exchanges go, never the system message or the last turn's image; the
    answer says how many turns went, and equals the answer to the conversation without them."""
    system = {"role": "system", "content": "Answer in one word."}
    exchanges = []
    for color in ("red", "blue", "green", "gray", "black", "yellow"):
        exchanges += [{"role": "user", "content": f"{color}?"}, {"role": "assistant", "content": "yes"}]
    last = {"role": "user", "content": [image_part(examples[1]), {"type": "text", "text": examples[1].question}]}
    answer = client.chat.completions.create(model="vlm", max_tokens=12, messages=[system, *exchanges, last])
    dropped = answer.model_extra["dropped_turns"]
    assert 0 < dropped < len(exchanges) and dropped % 2 == 0  # whole exchanges
    assert answer.usage.prompt_tokens <= 48  # the largest bucket that leaves room for 12 new tokens
    kept = client.chat.completions.create(model="vlm", max_tokens=12, messages=[system, *exchanges[dropped:], last])
    assert kept.model_extra["dropped_turns"] == 0
    assert (kept.usage.prompt_tokens, kept.choices[0].message.content) == \
        (answer.usage.prompt_tokens, answer.choices[0].message.content)
    streamed = list(client.chat.completions.create(model="vlm", max_tokens=12, stream=True,
                                                   messages=[system, *exchanges, last]))
    assert streamed[0].model_extra["dropped_turns"] == dropped
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == answer.choices[0].message.content


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user", "content": [{"type": "text", "text": "a"}]}, {"role": "assistant", "content": "b"}],
     "the last message must be the user's"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "c"}],
     "system message after the conversation started"),
    ([{"role": "tool", "content": "a"}, {"role": "user", "content": "c"}], "tools are not supported"),
])
def test_a_conversation_the_template_cannot_lay_out_is_refused_by_name(client, messages, match):
    with pytest.raises(openai.BadRequestError, match=match):
        client.chat.completions.create(model="vlm", max_tokens=2, messages=messages)


def test_two_images_for_a_model_that_takes_one_are_refused_by_name(server, client, examples):
    two = [{"role": "user", "content": [image_part(examples[0]), {"type": "text", "text": "this one"}]},
           {"role": "assistant", "content": "red"},
           {"role": "user", "content": [image_part(examples[1]), {"type": "text", "text": "and this one?"}]}]
    with pytest.raises(openai.BadRequestError, match="one image per conversation") as raised:
        client.chat.completions.create(model="vlm", max_tokens=2, messages=two)
    assert raised.value.body["param"] == "messages"
    status, body = call(f"{server.rest_url}/model/vlm:generate", {"instances": [
        {"text": "q", "history": "[{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]", **GREEDY}]})
    assert "history: the conversation places 1 image(s)" in body["instances"][0]["error_msg"]  # the instance's error
    status, body = call(f"{server.rest_url}/model/vlm:generate", {"instances": [{"text": "q", "history": "[{"}]})
    assert "history: not valid JSON" in body["instances"][0]["error_msg"]


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
    with pytest.raises(openai.BadRequestError, match=r"n: expected an integer in \[1, 8\]"):
        client.chat.completions.create(model="vlm", n=9, messages=messages)
    with pytest.raises(openai.BadRequestError, match="top_logprobs: needs logprobs set to true"):
        client.chat.completions.create(model="vlm", top_logprobs=2, messages=messages)
    with pytest.raises(openai.BadRequestError, match=r"presence_penalty: expected a value in \[-2, 2\]"):
        client.chat.completions.create(model="vlm", presence_penalty=2.5, messages=messages)
    with pytest.raises(openai.BadRequestError, match="temperature: expected a value in"):
        client.chat.completions.create(model="vlm", temperature=7.5, messages=messages)
    answer = client.chat.completions.create(model="vlm", max_tokens=3, messages=messages)  # text only: still works
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.usage.completion_tokens <= 3


def test_logprobs_are_the_sampled_tokens_and_sum_to_the_answer_s(server, client, examples):
    """logprobs: one entry per completion token, the greedy token the most likely of its top_logprobs, their sum
    the answer's (REST's mean_logprob x tokens), the same in a stream."""
    messages = [{"role": "user", "content": [image_part(examples[0]), {"type": "text", "text": examples[0].question}]}]
    answer = client.chat.completions.create(model="vlm", max_tokens=12, messages=messages, logprobs=True,
                                            top_logprobs=3)
    entries = answer.choices[0].logprobs.content
    assert len(entries) == answer.usage.completion_tokens
    for entry in entries:
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert bytes(entry.bytes).decode() == entry.token
    rest = generate(server, typed(examples[0]))
    assert sum(e.logprob for e in entries) == pytest.approx(float(rest["mean_logprob"]) * len(rest["tokens"]), abs=1e-4)
    chunks = list(client.chat.completions.create(model="vlm", max_tokens=12, messages=messages, logprobs=True,
                                                 stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in entries]
    plain = client.chat.completions.create(model="vlm", max_tokens=12, messages=messages)
    assert plain.choices[0].logprobs is None


def test_n_choices_are_each_the_answer_of_their_own_seed(client):
    """n=3 sampled with seed 5: choice i is what seed 5 + i gives alone, whole and streamed."""
    messages = [{"role": "user", "content": "What shape is in the image?"}]
    settings = {"model": "vlm", "max_tokens": 8, "temperature": 1.5, "messages": messages}
    answer = client.chat.completions.create(n=3, seed=5, **settings)
    alone = [client.chat.completions.create(seed=5 + i, **settings) for i in range(3)]
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert [c.message.content for c in answer.choices] == [a.choices[0].message.content for a in alone]
    assert answer.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert len({c.message.content for c in answer.choices}) > 1
    chunks = list(client.chat.completions.create(n=3, seed=5, stream=True, **settings))
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in range(3)]
    assert texts == [c.message.content for c in answer.choices]


def test_presence_and_frequency_penalties_reach_the_sampler(server, client):
    """The penalties over the OpenAI route give what REST generate gives with them, and change a long greedy
    answer that repeats itself."""
    messages = [{"role": "user", "content": "What color is it?"}]
    settings = {"max_tokens": 16, "ignore_eos": True}
    free = generate(server, {"text": "What color is it?", **settings})
    penalised = generate(server, {"text": "What color is it?", "frequency_penalty": 2.0, "presence_penalty": 1.0,
                                  **settings})
    assert len(set(penalised["tokens"])) > len(set(free["tokens"]))  # repeats cost: more distinct tokens
    answer = client.chat.completions.create(model="vlm", messages=messages, max_tokens=16, frequency_penalty=2.0,
                                            presence_penalty=1.0, extra_body={"ignore_eos": True})
    assert answer.choices[0].message.content == penalised["text"]


@pytest.mark.parametrize("fields, param, match", [
    ({"response_format": {"type": "json_object"}}, "response_format", "tokenizer cannot spell"),
    ({"extra_body": {"guided_choice": ["yes", "no"]}}, "guided_choice", "tokenizer cannot spell"),
    ({"extra_body": {"guided_grammar": "start: x"}}, "guided_grammar", "guided_grammar: not supported"),
    ({"extra_body": {"best_of": 3}}, "best_of", "best_of: not a field")])
def test_a_field_the_server_would_ignore_is_refused_by_name(client, fields, param, match):
    """Nothing silently ignored: the client reads a 400 whose param names the field, never an answer that looks as
    if it had been honoured (structured output on a word-level vocabulary, which cannot spell JSON, included); the
    value that asks for nothing passes."""
    messages = [{"role": "user", "content": "What shape is it?"}]
    with pytest.raises(openai.BadRequestError, match=match) as raised:
        client.chat.completions.create(model="vlm", max_tokens=2, messages=messages, **fields)
    assert raised.value.body["param"] == param
    answer = client.chat.completions.create(model="vlm", max_tokens=2, messages=messages,
                                            response_format={"type": "text"}, user="u1")
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


def test_embeddings_over_the_openai_client_are_the_packages_text_embeddings(server, client):
    """/v1/embeddings runs a package's embed_text: the vectors REST gets, unit length, as floats or base64, tokens
    counted by its tokenizer; a model without a text embedding and what the route does not do are refused by name."""
    import numpy as np

    texts = ["a red circle", "what color is the shape?"]
    answer = client.embeddings.create(model="vqa", input=texts)
    status, rest = call(f"{server.rest_url}/model/vqa:embed_text", {"instances": [{"text": t} for t in texts]})
    assert status == 200
    for item, expected in zip(answer.data, rest["instances"]):
        np.testing.assert_allclose(item.embedding, expected["embedding"], rtol=1e-6, atol=1e-7)
        assert np.linalg.norm(item.embedding) == pytest.approx(1.0, abs=1e-4)
    assert [item.index for item in answer.data] == [0, 1]
    assert answer.usage.prompt_tokens == len("a red circle".split()) + 2 + len("what color is the shape ?".split()) + 2
    packed = client.embeddings.create(model="vqa", input="a red circle", encoding_format="base64")
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(packed.data[0].embedding), "<f4"),
                               answer.data[0].embedding, rtol=1e-6)
    with pytest.raises(openai.BadRequestError, match="has no text embedding") as raised:
        client.embeddings.create(model="vlm", input="a red circle")
    assert raised.value.code == "model_not_embedding"
    with pytest.raises(openai.BadRequestError, match="dimensions: this server's embeddings keep their trained width"):
        client.embeddings.create(model="vqa", input="a red circle", dimensions=8)
    with pytest.raises(openai.BadRequestError, match="token ids are not taken"):
        client.embeddings.create(model="vqa", input=[[1, 2, 3]])
