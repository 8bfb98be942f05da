"""Hostile clients against a live server on 127.0.0.1 (strict HTTP, small limits): request heads that never finish,
more connections than allowed, bodies that never come, oversize or undecodable bodies, 170,000 instances (100,000
over gRPC), a tensor of a million dims, images whose header claims 20000x20000, several clients decoding 4096x4096
images at once, and admin calls without the token. Each is answered with its own text, counted, bounded in
memory, and the server still answers /health."""
import base64
import io
import json
import logging
import re
import socket
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from live import call, config, grpc_raw, metrics, predict, total
from PIL import Image

from mindvl import preprocess
from mindvl.serving import grpc_protocol as G
from mindvl.serving import protocol
from mindvl.serving.server import BackgroundServer

HEAD_TIMEOUT_S = 1.0
KEEPALIVE_S = 1.5
MAX_CONNECTIONS = 8
TIMEOUT_S = 10.0  # room for CLIENTS queued 4096x4096 decodes on one slot: 3 s was too short on an AVX2 host
DECODE_SLOTS = 1
CLIENTS = 6  # sending 4096x4096 images at once
TOKEN = "0123456789abcdef-hostile-test-token"
PATIENCE_S = 30  # a socket read that waits longer fails the test instead of hanging it
PREDICT_HEAD = b"POST /model/vqa:embed_text HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@pytest.fixture(scope="module")
def server(deployed, tmp_path_factory):
    """Short timeouts, 8 connections, one decode slot, 8 MB bodies, admin endpoints behind TOKEN (from a file); graphs
    at batch 1 only (the front door is under test here, batching is test_server's: each graph bucket is a compile
    at every load, the admin test's reload included)."""
    token_file = tmp_path_factory.mktemp("admin") / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with BackgroundServer(config(deployed, strict_http=True, header_timeout_s=HEAD_TIMEOUT_S, keepalive_s=KEEPALIVE_S,
                                 max_connections=MAX_CONNECTIONS, timeout_s=TIMEOUT_S, max_request_mb=8,
                                 max_inflight_mb=16, decode_slots=DECODE_SLOTS, max_batch_size=1,
                                 admin_token_file=str(token_file))) as server:
        yield server


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.rest_port), timeout=PATIENCE_S)


def read_to_close(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    reply = b""
    while chunk := connection.recv(65536):
        reply += chunk
    return reply


def answer_of(reply: bytes):
    """(status code, decoded JSON body) of one raw HTTP/1.1 response."""
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def read_answer(connection: socket.socket):
    """(status code, decoded JSON body) of the next response on the connection, read to its Content-Length (the
    server may keep the connection open a while after it, reading what the client still sends)."""
    reply = b""
    while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < int(
            re.search(rb"Content-Length: (\d+)", reply, re.IGNORECASE).group(1)):
        chunk = connection.recv(65536)
        assert chunk, reply
        reply += chunk
    return answer_of(reply)


def counted(before, after, kind):
    return total(after, "mindvl_errors_total", kind=kind) - total(before, "mindvl_errors_total", kind=kind)


def healthy(server) -> bool:
    return call(f"{server.rest_url}/health", method="GET") == (200, {"status": "alive"})


# ----------------------------------------------------------------------------- connections

def test_a_request_head_that_never_finishes_is_cut_off_and_counted(server):
    """A client dribbling header bytes (each well within any idle timeout) is answered 408 once the head is
    --header-timeout-s late; one that sends nothing is closed silently; both count as slow_headers."""
    before = metrics(server)
    with connect(server) as dribbler, connect(server) as silent:
        dribbler.sendall(PREDICT_HEAD)
        dribbler.settimeout(0.2)
        reply = b""
        for _ in range(int(PATIENCE_S / 0.2)):
            try:
                chunk = dribbler.recv(65536)
            except socket.timeout:
                dribbler.sendall(b"X")  # one more byte of a header that never ends
                continue
            if not chunk:
                break
            reply += chunk
        assert answer_of(reply) == (408, {"error_msg": f"the request head did not arrive within {HEAD_TIMEOUT_S:g} s "
                                                       f"(--header-timeout-s)"})
        assert read_to_close(silent) == b""
    assert counted(before, metrics(server), "slow_headers") == 2
    assert healthy(server)


def test_a_kept_alive_connection_serves_requests_and_is_closed_once_idle(server):
    """Two requests on one connection are answered; left idle, it is closed by --keepalive-s, uncounted."""
    before = metrics(server)
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with connect(server) as connection:
        for _ in range(2):
            connection.sendall(request)
            assert read_answer(connection) == (200, {"status": "alive"})
        assert read_to_close(connection) == b""  # closed by the server, with nothing more said
    assert counted(before, metrics(server), "slow_headers") == 0


def test_connections_past_the_limit_are_answered_503_and_a_body_that_never_comes_408(server):
    """MAX_CONNECTIONS clients declare a body and never send it: each is answered 408 after --timeout-s; while they
    hold every connection, one more client is answered 503 and closed. Both counted; the server then answers."""
    before = metrics(server)
    holders = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for holder in holders:
            holder.sendall(PREDICT_HEAD + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        with connect(server) as extra:
            assert answer_of(read_to_close(extra)) == (503, {
                "error_msg": f"the server has {MAX_CONNECTIONS} connections open, its limit (--max-connections); "
                             f"retry later"})
        for holder in holders:
            assert read_answer(holder) == (408, {
                "error_msg": f"the request body did not arrive within {TIMEOUT_S:g} s (--timeout-s)"})
    finally:
        for holder in holders:
            holder.close()
    after = metrics(server)
    assert counted(before, after, "too_many_connections") == 1
    assert counted(before, after, "slow_body") == MAX_CONNECTIONS
    assert healthy(server)


# ----------------------------------------------------------------------------- bodies

def raw_request(server, head: bytes, body: bytes = b""):
    """(status, JSON answer) of one request sent as bytes on its own connection."""
    with connect(server) as connection:
        connection.sendall(head + b"Connection: close\r\n\r\n" + body)
        return read_answer(connection)


def test_oversize_undecodable_and_too_many_instance_bodies_are_refused_cheaply(server, monkeypatch, caplog):
    """A declared gigabyte is refused before it is sent, bad gzip is a protocol error (and no traceback in the log:
    aiohttp's lingering read logged one for every such body), and 170,000 instances are refused without the JSON
    parser seeing the body."""
    caplog.set_level(logging.WARNING)
    parsed = []
    parse = protocol._load_json
    monkeypatch.setattr(protocol, "_load_json", lambda raw: parsed.append(len(raw)) or parse(raw))
    before = metrics(server)
    assert raw_request(server, PREDICT_HEAD + b"Content-Length: 1000000000\r\n") == (
        413, {"error_msg": "request body exceeds 8 MB (--max-request-mb)"})
    garbage = json.dumps({"instances": [{"text": "hi"}]}).encode()
    status, answer = raw_request(server, PREDICT_HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n"
                                 % len(garbage), garbage)
    assert status == 400 and answer["error_msg"].startswith(
        "Parser request failed, the body is not valid Content-Encoding gzip")
    many = json.dumps({"instances": [{"text": "what shape is it"}] * 170_000}).encode()
    assert call(f"{server.rest_url}/model/vqa:embed_text", many) == (400, {
        "error_msg": "Parser request failed, the request holds more than the limit of 64 instances (--max-instances)"})
    assert parsed == []
    assert len(predict(server, "vqa:embed_text", [{"text": "what shape is it"}] * 64)) == 64
    assert parsed == [len(json.dumps({"instances": [{"text": "what shape is it"}] * 64}))]
    after = metrics(server)
    assert counted(before, after, "too_large") == 1 and counted(before, after, "protocol") == 2
    assert total(after, "mindvl_inflight_body_bytes") == 0  # every request gave its share of the budget back
    assert healthy(server)
    assert not [r for r in caplog.records if r.exc_info], "a client's bad body was logged with a traceback"


def test_grpc_refuses_too_many_instances_and_a_shape_of_a_million_dims_before_converting_them(server):
    """The parsed message's instance count is checked before any tensor is converted, and a tensor's dims count
    before its dims become a list (or a message of a million numbers)."""
    spec = G.ServableSpec(name="vqa", method_name="embed_text")
    text = G.Tensor(dtype=G.DataType.MS_STRING, bytes_val=[b"hi"])
    many = G.PredictRequest(servable_spec=spec, instances=[G.Instance(items={"text": text})] * 100_000)
    with pytest.raises(G.RequestFailed, match=r"^Parser request failed, the request holds 100000 instances, more "
                                              r"than the limit of 64 \(--max-instances\)$"):
        G.results_from_reply(grpc_raw(server, many))
    wide = G.Tensor(dtype=G.DataType.MS_FLOAT32, shape=G.TensorShape(dims=[1] * 1_000_000), data=bytes(4))
    with pytest.raises(G.RequestFailed, match=r"^Parser request failed, instance 0, input 'text': Tensor check "
                                              r"failed: input shape of 1000000 dims invalid: expected at most 32 "
                                              r"dims, each >= 0$"):
        G.results_from_reply(grpc_raw(server, G.PredictRequest(servable_spec=spec,
                                                               instances=[G.Instance(items={"text": wide})])))
    assert healthy(server)


# ----------------------------------------------------------------------------- images

def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 40)).save(buffer, "PNG")
    return buffer.getvalue()


def claiming(width: int, height: int) -> bytes:
    """A small real PNG whose IHDR claims width x height (its CRC fixed), as a decompression bomb's header does."""
    real = png(8, 8)
    fields = struct.pack(">II", width, height) + real[24:29]  # bit depth, colour type, compression, filter, interlace
    chunk = b"IHDR" + fields
    return real[:8] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + real[33:]


def rss_bytes() -> int:
    with open("/proc/self/status") as status:  # the server runs in this process (BackgroundServer)
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def test_huge_images_are_refused_from_their_header_and_concurrent_decodes_stay_within_the_bound(server):
    """Headers claiming 20000x20000 (Pillow's bomb limit) or 5000x5000 (ours) fail their instance before a pixel is
    decoded; 6 clients sending 4096x4096 images at once (the largest allowed) are answered, and this process's RSS
    stays within DECODE_SLOTS x MAX_IMAGE_PIXELS x 8 bytes (+64 MB) of what it was: the decode slots hold."""
    image = {"image": {"b64": base64.b64encode(png(4096, 4096)).decode()}}
    assert "embedding" in predict(server, "vqa:embed_image", [image])[0]  # warm: the first decode's allocations
    refused = predict(server, "vqa:embed_image", [{"image": {"b64": base64.b64encode(claiming(w, w)).decode()}}
                                                  for w in (20000, 5000)])
    assert "image: the image holds more than the limit of 16,777,216 pixels (Pillow: Image size (400000000 " \
           "pixels) exceeds limit" in refused[0]["error_msg"]
    assert refused[0]["error_msg"].endswith("resize it to at most 4096x4096")
    assert "image: the image is 5000x5000 pixels, more than the limit of 16,777,216 pixels; resize it to at most " \
           "4096x4096" in refused[1]["error_msg"]

    baseline, peak, done = rss_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(CLIENTS) as clients:  # more than the server's 4 workers, fewer than its connections
            answers = list(clients.map(lambda _: predict(server, "vqa:embed_image", [image]), range(CLIENTS)))
    finally:
        done.set()
        sampler.join()
    assert all("embedding" in answer[0] for answer in answers)
    bound = DECODE_SLOTS * preprocess.MAX_IMAGE_PIXELS * 8 + 64 * 2 ** 20
    print(f"RSS {baseline / 2 ** 20:.0f} MB before, peak +{(peak[0] - baseline) / 2 ** 20:.0f} MB with {CLIENTS} "
          f"clients decoding 4096x4096 ({DECODE_SLOTS} decode slot); bound +{bound / 2 ** 20:.0f} MB")
    assert peak[0] - baseline <= bound
    assert healthy(server)


# ----------------------------------------------------------------------------- admin

def admin_call(server, path, token=None):
    return call(server.rest_url + path, headers={"Authorization": f"Bearer {token}"} if token is not None else None)


def test_the_admin_endpoints_need_the_configured_token(server):
    """No or a wrong token: 401, counted; the token from the file: a version is unloaded and loaded back, and
    loading or unloading what is not there says so."""
    before = metrics(server)
    need = {"error_msg": "the admin endpoints need the header 'Authorization: Bearer <token>' with the token of "
                         "--admin-token-file or --admin-token-env"}
    assert admin_call(server, "/servables/vqa/version/1:unload") == (401, need)
    assert admin_call(server, "/servables/vqa/version/1:unload", TOKEN + "x") == (401, need)
    assert counted(before, metrics(server), "unauthorized") == 2
    assert predict(server, "vqa:embed_text", [{"text": "hi"}])  # still loaded

    status, unloaded = admin_call(server, "/servables/vqa/version/1:unload", TOKEN)
    assert status == 200 and unloaded["state"]["default_version"] is None
    assert call(f"{server.rest_url}/model/vqa:embed_text", {"instances": [{"text": "hi"}]})[0] == 404
    status, loaded = admin_call(server, "/servables/vqa/version/1:load", TOKEN)
    assert status == 200 and loaded["state"]["default_version"] == 1
    assert predict(server, "vqa:embed_text", [{"text": "hi"}])
    assert admin_call(server, "/servables/vqa/version/3:unload", TOKEN) == (404, {
        "error_msg": "unload servable vqa version 3: servable is not available: servable vqa version 3 is not "
                     "loaded (loaded: 1)"})
    status, answer = admin_call(server, "/servables/vqa/version/3:load", TOKEN)
    assert status == 404 and answer["error_msg"].startswith("load servable vqa version 3: servable vqa: has no "
                                                            "version 3 (it has 1)")
