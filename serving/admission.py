"""What the server lets in: REST connections (a limit, a deadline for each request head), request bodies (a
budget of bytes held at once) and callers of the admin endpoints (a bearer token).

aiohttp bounds neither: a client that sends a request head one byte every few seconds, or nothing at all,
held its connection for the hour aiohttp's keep-alive allows, and any number of such clients could connect.
Its keep-alive timer (`keepalive_timeout`) is kept for idle connections between requests; the head deadline
and the limit are here, in a protocol that wraps aiohttp's own for each accepted connection.
"""
import asyncio
import contextlib
import hmac
import logging
import os
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Set

from aiohttp import web

from mindvl.errors import ConfigError
from mindvl.serving.protocol import encode_error

LOG = logging.getLogger("mindvl.serving")


def _answer(status: str, message: str) -> bytes:
    """A whole HTTP/1.1 response that closes its connection, with MindSpore Serving's {"error_msg"} body."""
    body = encode_error(message)
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


class Connections:
    """The REST listener's protocol factory (`loop.create_server(connections, ...)`).

    Each accepted connection gets aiohttp's request handler from `factory` behind a `_Guarded` protocol that
      * closes it at once, answering 503, when `limit` connections are open already;
      * closes it when a request head is not complete `head_timeout_s` after the connection opened, or after
        the first byte of a later request: answering 408 if part of a head came, silently if nothing did.
    `count(kind)` is told of each connection closed so ("too_many_connections", "slow_headers").
    The server marks the span of each request with `handling(request)`, so that a connection busy with a
    request or idle after its answer (aiohttp's keep-alive timer closes those) is not timed as a head.
    """

    def __init__(self, factory: Callable[[], asyncio.Protocol], limit: int, head_timeout_s: float,
                 count: Callable[[str], None]) -> None:
        self.factory = factory
        self.limit = limit
        self.head_timeout_s = head_timeout_s
        self.count = count
        self.open: Set["_Guarded"] = set()

    def __call__(self) -> asyncio.Protocol:
        return _Guarded(self)

    @contextlib.contextmanager
    def handling(self, request: web.BaseRequest) -> Iterator[None]:
        """The request's head is complete: its connection's deadline is off while the request is handled.

        After it, the next byte starts the next head's deadline, unless the body was left unread (a refused
        request): aiohttp then reads and drops the rest for at most 10 s (its lingering time) and closes the
        connection, or its keep-alive timer closes it if the next head does not come."""
        transport = request.transport
        guarded = transport.get_protocol() if transport is not None else None
        if not isinstance(guarded, _Guarded):
            yield
            return
        guarded.head_received()
        try:
            yield
        finally:
            guarded.idle = request.content.is_eof()


class _Guarded(asyncio.Protocol):
    """One REST connection: aiohttp's protocol inside, every transport event passed on to it."""

    def __init__(self, connections: Connections) -> None:
        self.connections = connections
        self.inner: Optional[asyncio.Protocol] = None
        self.transport: Optional[asyncio.Transport] = None
        self.idle = False  # answered its last request and waits for the next one's first byte
        self.started = False  # bytes of the current head have come
        self._deadline: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        connections = self.connections
        if len(connections.open) >= connections.limit:
            connections.count("too_many_connections")
            transport.write(_answer("503 Service Unavailable", f"the server has {connections.limit} connections "
                                    f"open, its limit (--max-connections); retry later"))
            transport.close()
            return
        connections.open.add(self)
        self.inner = connections.factory()
        self.inner.connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self.connections.head_timeout_s, self._too_slow)

    def _too_slow(self) -> None:
        self._deadline = None
        self.connections.count("slow_headers")
        if self.started:
            self.transport.write(_answer("408 Request Timeout", f"the request head did not arrive within "
                                         f"{self.connections.head_timeout_s:g} s (--header-timeout-s)"))
        self.transport.close()

    def head_received(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.idle = self.started = False

    def data_received(self, data: bytes) -> None:
        if self.idle:  # the first byte of the next request on a kept-alive connection
            self.idle = False
            self._arm()
        self.started = True
        self.inner.data_received(data)

    def eof_received(self) -> Optional[bool]:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.inner is None:
            return
        self.connections.open.remove(self)
        if self._deadline is not None:
            self._deadline.cancel()
        self.inner.connection_lost(exc)


class BodyBudget:
    """At most `limit` bytes of request bodies held at once: a request acquires its share before its body is
    read and releases it once answered, waiting for room while there is none (all in the event loop's thread,
    so no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._waiters: List[asyncio.Future] = []

    async def acquire(self, size: int) -> None:
        """Hold `size` bytes (at most `limit`), waiting while they do not fit; cancelling the wait holds none."""
        while self.held + size > self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self.held += size

    def release(self, size: int) -> None:
        self.held -= size
        for waiter in self._waiters:  # each looks again; those that still do not fit wait again
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()


def read_admin_token(path: str, env: str) -> Optional[bytes]:
    """The admin endpoints' token, from the file `path` (its trailing newline stripped) or the environment
    variable `env`; None when neither is given, which keeps the endpoints off. Never a command-line value:
    `ps` shows those to every user of the machine."""
    if path and env:
        raise ConfigError("admin_token_file / admin_token_env: give the token one way, not both")
    if path:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"admin_token_file: {file}: no such file")
        if file.stat().st_mode & 0o077:
            LOG.warning("admin token file %s can be read by other users; chmod 600 %s", file, file)
        token, where = file.read_bytes().strip(), f"admin_token_file {file}"
    elif env:
        token, where = os.environ.get(env, "").encode().strip(), f"admin_token_env: environment variable {env}"
    else:
        return None
    if not token:
        raise ConfigError(f"{where}: empty or unset; put a long random token there (`openssl rand -hex 32`)")
    return token


def authorized(header: str, token: bytes) -> bool:
    """Whether an Authorization header is `Bearer <token>` (compared in constant time)."""
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"),
                                                              token)
