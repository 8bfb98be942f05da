"""A REST route's request body in and JSON reply out: the body read within the limits (max_request_mb, the
budget of bodies held at once, timeout_s), its instances parsed, and the reply's status: the failure's own, except
where a reply speaks MindSpore Serving's predict protocol, which answers errors with HTTP 200 and {"error_msg"}
(unless strict_http).

The functions take the `Server` (server.py) for its settings, its budget of bodies and its metrics.
"""
import asyncio
import contextlib
from typing import Any, Dict, List

from aiohttp import web

from mindvl.serving.failures import Failure
from mindvl.serving.protocol import ProtocolError, parse_request

PARSE_FACTOR = 8  # a JSON body may take this many times --max-request-mb to parse (protocol.parse_cost)


def json_reply(server, payload: bytes, status: int = 200, serving_protocol: bool = False) -> web.Response:
    """`payload` with `status`, or HTTP 200 for a reply of MindSpore Serving's predict protocol (`serving_protocol`)
    when strict_http is off, as its clients expect."""
    keep = serving_protocol and not server.config.strict_http
    return web.Response(body=payload, status=200 if keep else status, content_type="application/json")


def protocol_failure(server, error: ProtocolError) -> Failure:
    server.metrics.errors.labels("protocol").inc()
    return Failure(f"Parser request failed, {error}", 400, "protocol")


def parse_instances(server, body: bytes, max_instances: int) -> List[Dict[str, Any]]:
    """The body's instances, at most `max_instances`, within the parse budget; a bad body fails the request."""
    try:
        return parse_request(body, max_instances, PARSE_FACTOR * server.config.max_request_bytes)
    except ProtocolError as error:
        raise protocol_failure(server, error) from None


def _too_large(server) -> Failure:
    server.metrics.errors.labels("too_large").inc()
    return Failure(f"request body exceeds {server.config.max_request_mb:g} MB (--max-request-mb)", 413, "too_large")


@contextlib.asynccontextmanager
async def held_body(server, request: web.Request):
    """The request's body, its bytes held in the budget (max_inflight_mb) until the block ends: its declared
    Content-Length, or max_request_mb when the length is undeclared or the body compressed (aiohttp bounds a
    decoded body by client_max_size)."""
    config = server.config
    limit = config.max_request_bytes
    declared = request.content_length
    if declared is not None and declared > limit:  # refused before a byte of it is read
        raise _too_large(server)
    compressed = request.headers.get("Content-Encoding", "identity").lower() != "identity"
    size = limit if declared is None or compressed else declared
    try:
        await asyncio.wait_for(server.bodies.acquire(size), config.timeout_s)
    except asyncio.TimeoutError:
        server.metrics.errors.labels("busy").inc()
        raise Failure(f"the server is busy: {config.max_inflight_mb:g} MB of request bodies are being served "
                      f"(--max-inflight-mb) and no room came free within {config.timeout_s:g} s; retry later",
                      503, "busy") from None
    try:
        try:
            body = await _read_body(server, request)
        except ProtocolError as error:
            raise protocol_failure(server, error) from None
        yield body
    finally:
        server.bodies.release(size)


async def _read_body(server, request: web.Request) -> bytes:
    """The request's body, within timeout_s (a client that sends it a byte at a time is cut off, counted);
    one past max_request_mb as it arrives (undeclared or understated) is refused; one whose bytes do not
    decode as its Content-Encoding says is a protocol error; a client gone before the end is counted."""
    timeout_s = server.config.timeout_s
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except asyncio.TimeoutError:
        server.metrics.errors.labels("slow_body").inc()
        raise Failure(f"the request body did not arrive within {timeout_s:g} s (--timeout-s)", 408,
                      "slow_body") from None
    except ConnectionResetError:  # nobody to answer: counted, without the traceback of an internal error
        server.metrics.errors.labels("disconnected").inc()
        raise Failure("the client closed the connection before its body arrived", 400, "disconnected") from None
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(server) from None
    except web.RequestPayloadError as error:
        # Nothing more is read of a body that does not decode: aiohttp's lingering read after the answer would
        # meet the same error and log it, with its traceback, as an unhandled exception (a client's mistake).
        request.content.feed_eof()
        encoding = request.headers.get("Content-Encoding", "identity")
        raise ProtocolError(f"the body is not valid Content-Encoding {encoding} ({error.__cause__ or error}); "
                            "send it uncompressed or encoded as labelled") from None
