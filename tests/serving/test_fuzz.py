"""1,000 malformed or fuzzed HTTP requests (fixed seed) against a live server in its default mode: random and
truncated or mutated bodies, random JSON, damaged images, clips and questions, random and traversing URLs,
too many instances, wrong methods, oversize bodies. Each is answered with a protocol answer, HTTP 200 where
MindSpore Serving's predict protocol speaks and its 4xx status elsewhere (an admin path, an unknown one), none
resets the connection, and the server still answers a valid request afterwards."""
import asyncio
import json
import random
import re
import urllib.parse

import aiohttp
import pytest
import yarl

from live import b64, call, config, metrics, predict, total
from mindvl.data.reading.examples import query_examples
from mindvl.serving.rest_routes import serving_protocol
from mindvl.serving.server import BackgroundServer

SEED = 20240607
REQUESTS = 1000
MAX_REQUEST_MB = 0.25
MAX_INSTANCES = 8
INPUT_NAMES = ["image", "question", "audio", "text", "instances", "b64", "type", "shape", ""]
TRAVERSALS = ["/model/..%2F..%2Fetc:predict", "/model/%2E%2E/version/1:predict", "/model/vqa/version/1/..%2F..:predict",
              "/model/vqa%00:predict", "/servables/..%2F..%2Fetc/version/1:load", "/servables/%2E%2E/version/1:unload",
              "/model/vqa/version/-1:predict", "/model/vqa/version/99999999999:predict", "//model//vqa::predict",
              "/model/vqa:..", "/model/vqa:%2E%2E", "/model/.%2E/vqa:predict", "/model/vqa/version/1:..%2F..%2Fpredict",
              "/model/%C0%AE%C0%AE/etc:predict", "/model/vqa/version/1%2F..%2F2:predict", "/model/vqa%5C..%5Cx:predict"]
URL_PIECES = ["model", "vqa", "version", "0", "1", "2", "..", ".", "%2F", "%2E%2E", ":", "predict", "embed_text",
              "servables", "load", "unload", "%00", "%FF", "%25", "health", "metrics", "a" * 300, "~", "-", "_"]
REAL_ADMIN = re.compile(r"/servables/vqa/version/[0-9]+:(load|unload)")  # the fuzz must not change the server
METHODS = ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND"]


@pytest.fixture(scope="module")
def server(deployed):
    """Default (HTTP 200) mode with small limits, so that fuzzed requests can exceed them cheaply."""
    with BackgroundServer(config(deployed, max_batch_size=2, max_request_mb=MAX_REQUEST_MB,
                                 max_instances=MAX_INSTANCES)) as server:
        yield server


@pytest.fixture(scope="module")
def example(vqa_package):
    return query_examples(vqa_package[0].data.root, limit=1)[0]


@pytest.fixture(scope="module")
def valid_requests(example):
    """(path, body bytes) of valid requests, the seeds of the mutations."""
    bodies = [("/model/vqa:predict", {"image": b64(example.image), "question": example.question, "audio": b64(b"")}),
              ("/model/vqa:embed_text", {"text": example.question}),
              ("/model/vqa:embed_image", {"image": b64(example.image)})]
    return [(path, json.dumps({"instances": [inputs]}).encode()) for path, inputs in bodies]


def random_json(rng, depth=0):
    """A random JSON value: scalars at their edges, nested lists and objects with input-like keys."""
    kinds = ["null", "bool", "int", "float", "str", "list", "object"] if depth < 4 else ["int", "str"]
    kind = rng.choice(kinds)
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, -1, 2 ** 31, -2 ** 63, 10 ** 30, rng.randint(-1000, 1000)])
    if kind == "float":
        return rng.choice([0.5, -1e-45, 3.5e38, 1e308, rng.uniform(-1, 1)])
    if kind == "str":
        return "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)]))
                       for _ in range(rng.randint(0, 12)))
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(INPUT_NAMES): random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def random_url(rng):
    while True:
        path = "/" + "".join(rng.choice(URL_PIECES) + rng.choice(["/", "", ":"]) for _ in range(rng.randint(1, 6)))
        if not REAL_ADMIN.fullmatch(urllib.parse.unquote(path)):
            return path


def garbled(rng, example):
    """predict's inputs, well-formed but damaged: a PNG with bytes changed, a cut or random clip, any question."""
    image = bytearray(example.image)
    for _ in range(rng.randint(0, 6)):
        image[rng.randrange(len(image))] = rng.randrange(256)
    audio = rng.choice([b"", example.audio[:rng.randrange(20_000)], rng.randbytes(64)])
    question = rng.choice(["", example.question, random_json(rng, depth=4) if rng.random() < 0.5 else "?" * 500])
    return {"image": b64(bytes(image)), "question": question, "audio": b64(audio)}


def fuzzed(rng, valid_requests, example):
    """(kind, HTTP method, path, body) of one fuzzed request."""
    path, body = rng.choice(valid_requests)
    kind = rng.choice(["random bytes", "truncated", "mutated", "random json", "random url", "traversal",
                       "too many instances", "wrong method", "oversize", "deep nesting", "bad encoding",
                       "garbled inputs"])
    if kind == "garbled inputs":
        instances = [garbled(rng, example) for _ in range(rng.randint(1, 3))]
        return kind, "POST", "/model/vqa:predict", json.dumps({"instances": instances}).encode()
    if kind == "random bytes":
        return kind, "POST", path, rng.randbytes(rng.randint(0, 2048))
    if kind == "truncated":
        return kind, "POST", path, body[:rng.randrange(len(body))]
    if kind == "mutated":
        mutated = bytearray(body)
        for _ in range(rng.randint(1, 8)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        return kind, "POST", path, bytes(mutated)
    if kind == "random json":
        value = random_json(rng)
        wrapped = rng.choice([value, {"instances": value}, {"instances": [value]}])
        return kind, "POST", path, json.dumps(wrapped).encode()
    if kind == "random url":
        return kind, "POST", random_url(rng), body
    if kind == "traversal":
        return kind, rng.choice(["POST", "GET"]), rng.choice(TRAVERSALS), body
    if kind == "too many instances":
        count = rng.choice([MAX_INSTANCES + 1, rng.randint(MAX_INSTANCES + 2, 5000)])
        return kind, "POST", "/model/vqa:embed_text", json.dumps({"instances": [{"text": "what"}] * count}).encode()
    if kind == "wrong method":
        return kind, rng.choice(METHODS), path, body
    if kind == "oversize":
        size = rng.randint(int(MAX_REQUEST_MB * 2 ** 20) + 1, int(MAX_REQUEST_MB * 2 ** 20) * 3)
        return kind, "POST", "/model/vqa:embed_text", b'{"instances": [{"text": "' + b"a" * size + b'"}]}'
    if kind == "deep nesting":
        depth = rng.randint(100, 200_000)
        return kind, "POST", path, b'{"instances": ' + b"[" * depth + b"]" * rng.choice([0, depth]) + b"}"
    return kind, "POST", path, rng.choice([b"\xff\xfe" + body, body.replace(b'"', b"'"), body.decode().encode("utf-16"),
                                           b'{"instances": [{"text": NaN}]}', b'{"instances": [{"text": 1e400}]}'])


def protocol_answer(answer) -> bool:
    """{"error_msg": str}, or {"instances": [...]} with each entry outputs or {"error_msg": str} alone."""
    if not isinstance(answer, dict):
        return False
    if set(answer) == {"error_msg"}:
        return isinstance(answer["error_msg"], str) and bool(answer["error_msg"])
    return set(answer) == {"instances"} and isinstance(answer["instances"], list) and all(
        isinstance(entry, dict) and entry and ("error_msg" not in entry or set(entry) == {"error_msg"})
        for entry in answer["instances"])


def answered_as_its_route_answers(path: str, status: int, answer) -> bool:
    """A protocol answer with HTTP 200 on MindSpore Serving's predict paths (a refusal too, as that protocol answers
    it) and for every success; a refusal elsewhere with its 4xx status."""
    if not protocol_answer(answer):
        return False
    if serving_protocol(urllib.parse.unquote(path)) or "error_msg" not in answer:
        return status == 200
    return 400 <= status < 500


async def send_all(url, requests):
    """Every request over one keep-alive session, 8 at a time; -> (status, decoded JSON) per request."""
    limit = asyncio.Semaphore(8)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def send(method, path, body):
            async with limit, session.request(method, yarl.URL(url + path, encoded=True), data=body) as response:
                text = await response.read()
            try:
                return response.status, json.loads(text)
            except ValueError:  # reported, with the request, by the test
                return response.status, text
        return await asyncio.gather(*(send(method, path, body) for _, method, path, body in requests))


def test_a_thousand_fuzzed_requests_are_each_answered_and_the_server_keeps_serving(server, valid_requests, example):
    """Every answer is {"error_msg"} or an instances list (answers or per-instance errors) with its route's status;
    the kinds no server may accept are all refused; errors are counted; the server then still answers."""
    rng = random.Random(SEED)
    requests = [fuzzed(rng, valid_requests, example) for _ in range(REQUESTS)]
    before = metrics(server)
    answers = asyncio.run(send_all(server.rest_url, requests))

    odd = [(kind, method, path[:80], status, str(answer)[:200]) for (kind, method, path, _), (status, answer)
           in zip(requests, answers) if not answered_as_its_route_answers(path, status, answer)]
    assert odd == []
    always_refused = {"random bytes", "truncated", "traversal", "too many instances", "wrong method", "oversize",
                      "deep nesting", "bad encoding"}
    accepted = [(kind, path) for (kind, _, path, _), (_, answer) in zip(requests, answers)
                if kind in always_refused and "error_msg" not in answer]
    assert accepted == []
    assert {kind for kind, *_ in requests} >= always_refused | {"mutated", "random json", "random url",
                                                                "garbled inputs"}

    path, body = valid_requests[0]
    assert {"answer", "confidence", "answer_text"} == set(predict(server, path[len("/model/"):],
                                                                  json.loads(body)["instances"])[0])
    assert call(f"{server.rest_url}/health", method="GET") == (200, {"status": "alive"})
    after = metrics(server)
    for kind in ("protocol", "too_large"):
        assert total(after, "mindvl_errors_total", kind=kind) > total(before, "mindvl_errors_total", kind=kind)
