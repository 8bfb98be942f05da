"""`mindvl serve`: MindSpore Serving 2.0's REST and gRPC protocols over a servable directory, in one event loop.

REST (aiohttp) and gRPC (grpc.aio) share the catalog of loaded versions, the dynamic batchers, the worker
pool for Python stages and the metrics. A generative servable's `generate` streams its answer as Server-Sent
Events when asked with `Accept: text/event-stream`. Besides `POST /model/<servable>[/version/<n>]:<method>`:
  POST /v1/chat/completions              the OpenAI chat API over the generative servables (openai_api.py)
  GET  /v1/models                        the generative servables, as OpenAI lists models
  GET  /health                           the process answers (liveness)
  GET  /ready                            200 once there are servables and each has a loaded version, else 503
  GET  /metrics                          Prometheus text: requests, errors, latency, batch sizes
  GET  /servables                        every servable's versions and their status (JSON)
  GET  /                                 the demo page (demo.py; off with demo=False, `mindvl serve --no-demo`)
  POST /cascade                          one instance through the edge-cloud cascade (`--cascade-edge PKG`)
  POST /servables/<name>/version/<n>:load|unload   load a version (it becomes the default when newest) or
                                         unload one (its running requests finish first); off unless an admin
                                         token is configured, then only with `Authorization: Bearer <token>`
A new version folder (`mindvl deploy`) is noticed within `poll_s` and loaded while the old one serves.
Errors answer HTTP 200 with {"error_msg": ...} as MindSpore Serving does; `strict_http` uses 4xx/5xx.
What a client may hold (connections, request heads, bodies, decodes) is bounded: see `ServeConfig` and
admission.py; docs/serving.md states the memory bound that follows.
"""
import asyncio
import contextlib
import ctypes
import json
import logging
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mindvl.errors import ConfigError
from mindvl.config import build_dataclass
from mindvl.errors import PackageError
from mindvl.package_reader import MANIFEST, read_key
from mindvl.preprocess import limit_decodes
from mindvl.serving import demo as D
from mindvl.serving import grpc_protocol as G
from mindvl.serving import openai_api as O
from mindvl.serving.admission import BodyBudget, Connections, authorized, read_admin_token
from mindvl.serving.batching import BatchPolicy
from mindvl.serving.catalog import Catalog, NotAvailable
from mindvl.serving.protocol import (MAX_VERSION, InstanceError, ProtocolError, encode_error, encode_reply,
                                     parse_request, parse_url, too_many_instances)
from mindvl.serving.register import GENERATE, ServableError
from mindvl.serving.runtime import MAX_GRAPH_BATCH, LoadedVersion, MethodNotFound
from mindvl.serving.servable import CONFIG_FILE, list_servables

LOG = logging.getLogger("mindvl.serving")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
ADMIN_URL = re.compile(r"/servables/([^/]+)/version/([0-9]{1,10}):(load|unload)")
MB = 2 ** 20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
STOP_GRACE_S = 5.0  # how long a stopping server lets the requests in progress finish (a slow client held it 60 s)
PARSE_FACTOR = 8  # a JSON body may take this many times --max-request-mb to parse (protocol.parse_cost)
OPENAI_PATHS = ("/v1/chat/completions", "/v1/models")
WATCH_S = 0.05  # how often a streaming request's connection is checked
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class ServeConfig:
    """Settings of `mindvl serve` (each a command-line flag; a YAML file may hold them under these keys)."""

    servable_dir: str = ""
    host: str = "127.0.0.1"  # loopback only unless told otherwise
    port: int = 1500  # REST; 0: any free port (MindSpore Serving's examples use 1500 for REST)
    grpc_port: int = 5500  # 0: any free port, -1: no gRPC server
    batching: bool = True
    max_batch_size: int = 16  # instances run together on a model graph (from concurrent requests)
    max_wait_ms: float = 2.0  # how long a batch waits for more requests once it could run
    workers: int = 4  # threads for the Python stages (decode, resize, tokenise, log-mel)
    max_request_mb: float = 32.0
    max_instances: int = 64  # per request
    timeout_s: float = 60.0  # per request, queueing included; and for a REST body to arrive
    header_timeout_s: float = 10.0  # a REST request head must arrive within this (from the connection's start or
    # from the first byte of a later request on it)
    keepalive_s: float = 15.0  # an idle kept-alive REST connection is closed after this
    max_connections: int = 256  # REST connections open at once (more are answered 503 and closed)
    max_inflight_mb: float = 512.0  # request bodies held at once: REST bodies wait for room (from before they are
    # read until answered); gRPC calls in progress are limited to max_inflight_mb / max_request_mb
    decode_slots: int = 2  # pixels decoding at once: this many 4096x4096 images (128 MB each), or more smaller ones
    strict_http: bool = False  # 4xx/5xx status codes instead of MindSpore Serving's HTTP 200 for errors
    poll_s: float = 2.0  # how often the servable directory is checked for new versions; 0: never
    key_file: str = ""  # AES-GCM key of encrypted packages, from a file ...
    key_env: str = ""  # ... or from this environment variable
    admin_token_file: str = ""  # the admin endpoints' bearer token, from a file ...
    admin_token_env: str = ""  # ... or from this environment variable; neither: the admin endpoints are off
    demo: bool = True  # the demo page at GET / (a client of the same endpoints; mindvl serve --no-demo: off)

    def validate(self) -> "ServeConfig":
        if not self.servable_dir:
            raise ConfigError("servable_dir: required; pass --servable-dir DIR (fill it with `mindvl deploy`)")
        folder = Path(self.servable_dir)
        if not folder.is_dir():
            raise ConfigError(f"servable_dir: {folder} is not a folder; create it with "
                              f"`mindvl deploy PKG --servable-dir {folder} --name NAME`")
        if (folder / CONFIG_FILE).is_file():
            raise ConfigError(f"servable_dir: {folder} is one servable's folder (it holds {CONFIG_FILE}); serve the "
                              f"directory of servables above it: --servable-dir {folder.resolve().parent}")
        if (folder / MANIFEST).is_file():
            raise ConfigError(f"servable_dir: {folder} is a model package; deploy it into a servable directory "
                              f"(`mindvl deploy {folder} --servable-dir DIR --name NAME`) and serve DIR")
        for name in ("max_batch_size", "workers", "max_instances", "max_connections", "decode_slots"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: expected an integer >= 1, got {getattr(self, name)}")
        for name in ("max_request_mb", "timeout_s", "header_timeout_s", "keepalive_s", "max_inflight_mb"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: expected a number > 0, got {getattr(self, name)}")
        if self.max_inflight_mb < self.max_request_mb:
            raise ConfigError(f"max_inflight_mb: {self.max_inflight_mb:g} is less than max_request_mb "
                              f"{self.max_request_mb:g}, so a body of the largest size could never be served; "
                              f"raise --max-inflight-mb or lower --max-request-mb")
        for name in ("max_wait_ms", "poll_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: expected a number >= 0, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535 or not -1 <= self.grpc_port <= 65535:
            raise ConfigError(f"port {self.port} / grpc_port {self.grpc_port}: expected 0..65535 (grpc_port -1: off)")
        if self.max_batch_size > MAX_GRAPH_BATCH:
            raise ConfigError(f"max_batch_size: at most {MAX_GRAPH_BATCH}, got {self.max_batch_size}")
        return self

    @classmethod
    def from_mapping(cls, values: Dict[str, Any]) -> "ServeConfig":
        return build_dataclass(cls, values)


class Metrics:
    """Prometheus counters and histograms, in a registry of their own (several servers in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("mindvl_requests", "Predict requests answered", ["servable", "method", "protocol", "outcome"],
                                registry=self.registry)
        self.errors = Counter("mindvl_errors", "Failed requests or instances by kind", ["kind"], registry=self.registry)
        self.instances = Counter("mindvl_instances", "Instances answered", ["servable", "method"], registry=self.registry)
        self.latency = Histogram("mindvl_request_latency_seconds", "Predict latency, queueing included",
                                 ["servable", "method", "protocol"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("mindvl_batch_size", "Instances per executed graph batch", ["servable", "model"],
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=self.registry)
        self.loaded = Gauge("mindvl_loaded_versions", "Loaded versions per servable", ["servable"], registry=self.registry)
        self.connections = Gauge("mindvl_open_connections", "REST connections open", registry=self.registry)
        self.inflight = Gauge("mindvl_inflight_body_bytes", "REST request bodies held, read to answered",
                              registry=self.registry)


class Failure(Exception):
    """A whole request failed: the message for the client and the HTTP status of strict mode."""

    def __init__(self, message: str, status: int, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _failure(error: BaseException) -> Failure:
    """Any exception of a request -> the Failure the client reads (internal errors named, never raised)."""
    if isinstance(error, Failure):
        return error
    if isinstance(error, (NotAvailable, MethodNotFound)):
        return Failure(str(error), 404, "not_found")
    if isinstance(error, ProtocolError):
        return Failure(str(error), 400, "protocol")
    if isinstance(error, asyncio.TimeoutError):
        return Failure(str(error) or "request timed out", 504, "timeout")
    LOG.exception("request failed", exc_info=error)
    return Failure(f"internal error: {type(error).__name__}: {error}", 500, "internal")


class Server:
    """The REST and gRPC servers over one catalog; `start` and `stop` from a running event loop."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config.validate()
        self.key = read_key(config.key_file or None, config.key_env or None)
        self.admin_token = read_admin_token(config.admin_token_file, config.admin_token_env)
        self.catalog = Catalog(Path(config.servable_dir), self.key, config.max_batch_size if config.batching else 1)
        self.metrics = Metrics()
        self.pool = ThreadPoolExecutor(config.workers, thread_name_prefix="stage")
        self.batching = BatchPolicy(config.max_batch_size, config.max_wait_ms / 1000, lambda servable, graph, size:
                                    self.metrics.batch_size.labels(servable, graph).observe(size)) \
            if config.batching else None
        self.ready = False
        self.rest_port: Optional[int] = None
        self.grpc_port: Optional[int] = None
        self.bodies = BodyBudget(int(config.max_inflight_mb * MB))
        self.metrics.inflight.set_function(lambda: self.bodies.held)
        self._connections: Optional[Connections] = None
        self._runner: Optional[web.AppRunner] = None
        self._listener: Optional[asyncio.Server] = None
        self._grpc: Optional[grpc.aio.Server] = None
        self._poller: Optional[asyncio.Task] = None
        self.cascade: Optional[D.CascadeEndpoint] = None

    def attach_cascade(self, service: D.CascadeService) -> None:
        """Answer `POST /cascade` through `service` (whose cloud is usually this server: attach it once the
        server listens); the server closes it when it stops."""
        self.cascade = D.CascadeEndpoint(service)

    @property
    def grpc_calls(self) -> int:
        """gRPC calls in progress at once: grpc receives a whole message before mindvl sees it, so the bodies'
        budget bounds gRPC by count, each call taken at the largest size (more are refused RESOURCE_EXHAUSTED)."""
        return int(self.config.max_inflight_mb // self.config.max_request_mb)

    @property
    def rest_url(self) -> str:
        return f"http://{self.config.host}:{self.rest_port}"

    @property
    def grpc_target(self) -> Optional[str]:
        return f"{self.config.host}:{self.grpc_port}" if self.grpc_port else None

    # ---- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen first (so /health and /ready answer while loading), then load each servable's newest version."""
        config = self.config
        if config.host not in LOOPBACK:
            LOG.warning("listening on %s: every machine that reaches this address can query the servables",
                        config.host)
        limit_decodes(config.decode_slots)
        _return_large_frees()
        app = web.Application(client_max_size=int(config.max_request_mb * MB))
        app.router.add_route("*", "/{path:.*}", self._rest)
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=config.keepalive_s,
                                     shutdown_timeout=STOP_GRACE_S)
        await self._runner.setup()
        self._connections = Connections(self._runner.server, config.max_connections, config.header_timeout_s,
                                        lambda kind: self.metrics.errors.labels(kind).inc())
        self.metrics.connections.set_function(lambda: len(self._connections.open))
        self._listener = await asyncio.get_running_loop().create_server(self._connections, config.host, config.port)
        self.rest_port = self._listener.sockets[0].getsockname()[1]
        if config.grpc_port >= 0:
            size = int(config.max_request_mb * MB)
            self._grpc = grpc.aio.server(options=[("grpc.max_receive_message_length", size),
                                                  ("grpc.max_send_message_length", size)],
                                         maximum_concurrent_rpcs=self.grpc_calls)
            G.add_predict_handler(self._grpc, self._grpc_predict)
            G.add_predict_stream_handler(self._grpc, self._grpc_predict_stream)
            self.grpc_port = self._grpc.add_insecure_port(f"{config.host}:{config.grpc_port}")
            if self.grpc_port == 0:
                raise OSError(f"gRPC: cannot listen on {config.host}:{config.grpc_port} (in use?)")
            await self._grpc.start()
        LOG.info("REST on http://%s:%d%s", config.host, self.rest_port,
                 f", gRPC on {config.host}:{self.grpc_port}" if self._grpc else "")
        await self.catalog.refresh()
        self._update_loaded()
        self.ready = True
        if config.poll_s > 0:
            self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_s)
            try:
                if await self.catalog.refresh():
                    self._update_loaded()
            except Exception:  # the poller must outlive any one bad servable
                LOG.exception("refreshing %s failed", self.config.servable_dir)

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self._grpc is not None:
            await self._grpc.stop(grace=STOP_GRACE_S)
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()  # closes the connections aiohttp holds
        await self.catalog.close()
        self.pool.shutdown(wait=False)
        if self.cascade is not None:
            self.cascade.close()

    def _update_loaded(self) -> None:
        for name, versions in self.catalog.loaded.items():
            self.metrics.loaded.labels(name).set(len(versions))

    # ---- predict (both protocols) ---------------------------------------------------------------------

    async def predict(self, servable: str, version: int, method: str, instances: List[Dict[str, Any]],
                      protocol: str) -> Tuple[List[Any], int]:
        """The results of `instances` and the version that answered; raises Failure."""
        start = time.perf_counter()
        labels = ("", "", protocol)  # names become labels only once they exist (bounded label sets)
        try:
            loaded = self.catalog.get(servable, version)
            loaded.method(method)
            labels = (servable, method, protocol)
            with self.catalog.using(loaded):
                results = await asyncio.wait_for(loaded.run(method, instances, self.pool, self.batching),
                                                 self.config.timeout_s)
        except asyncio.TimeoutError:
            failure = Failure(f"request timed out after {self.config.timeout_s:g} s (--timeout-s)", 504, "timeout")
            self._count(labels, start, failure.kind)
            raise failure from None
        except Exception as error:
            failure = _failure(error)
            self._count(labels, start, failure.kind)
            raise failure from None
        failed = sum(isinstance(result, BaseException) for result in results)
        self.metrics.instances.labels(servable, method).inc(len(results))
        if failed == len(results) and loaded.manifest is None and len({str(r) for r in results}) == 1:
            # MindSpore Serving folds a request whose every instance failed alike into one error_msg; its
            # servables get that reply (mindvl packages keep an entry per instance, which mindvl's client reads)
            self._count(labels, start, "instance")
            raise Failure(str(results[0]), 400, "instance")
        if failed:
            self.metrics.errors.labels("instance").inc(failed)
        self._count(labels, start, "partial" if failed else "ok")
        return results, loaded.version

    def _count(self, labels: Tuple[str, str, str], start: float, outcome: str) -> None:
        answered = outcome in ("ok", "partial")  # anything else is the kind of error that failed the request
        self.metrics.requests.labels(*labels, outcome if answered else "error").inc()
        if not answered:
            self.metrics.errors.labels(outcome).inc()
        self.metrics.latency.labels(*labels).observe(time.perf_counter() - start)

    # ---- REST -----------------------------------------------------------------------------------------

    def _json(self, payload: bytes, status: int = 200) -> web.Response:
        return web.Response(body=payload, status=status if self.config.strict_http else 200,
                            content_type="application/json")

    async def _rest(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        with self._connections.handling(request):
            try:
                if path.startswith("/model/") or path == "/model":
                    return await self._rest_predict(request)
                if path in OPENAI_PATHS:
                    return await self._openai_answer(request)
                if request.method == "GET" and path in ("/health", "/ready", "/metrics", "/servables"):
                    return self._status_page(path)
                if self.config.demo and request.method == "GET" and path in D.PATHS:
                    return D.settings(self.config.max_request_mb, self.cascade and self.cascade.service) \
                        if path == D.SETTINGS else D.asset(path)
                if path == D.CASCADE:
                    return await self._cascade(request)
                match = ADMIN_URL.fullmatch(path)
                if match and request.method == "POST":
                    return await self._admin(request, *match.groups())
                raise Failure(f"please check url: {request.method} {path[:64]!r} is not served; predict with "
                              f"POST /model/<servable>[/version/<n>]:<method>, POST /v1/chat/completions, or GET "
                              f"/health, /ready, /metrics, /servables, /v1/models"
                              + (", / (the demo page)" if self.config.demo else ""), 404, "protocol")
            except Exception as error:
                failure = _failure(error)
                return self._json(encode_error(str(failure)), failure.status)

    async def _rest_predict(self, request: web.Request) -> web.Response:
        """One predict request, answered while its body's bytes are held in the budget (max_inflight_mb): its
        declared Content-Length, or max_request_mb when the length is undeclared or the body compressed
        (aiohttp bounds a decoded body by client_max_size)."""
        if request.method != "POST":
            raise Failure("http message only support POST right now", 405, "protocol")
        try:
            servable, version, method = parse_url(path=request.path)
        except ProtocolError as error:
            raise self._protocol_failure(error) from None
        async with self._held_body(request) as body:
            try:
                instances = parse_request(body, self.config.max_instances, PARSE_FACTOR * self._request_limit)
            except ProtocolError as error:
                raise self._protocol_failure(error) from None
            if method == GENERATE and "text/event-stream" in request.headers.get("Accept", ""):
                return await self._generate_events(request, servable, version, instances)
            results, _ = await self.predict(servable, version, method, instances, "rest")
            return self._json(encode_reply(results))

    async def _cascade(self, request: web.Request) -> web.Response:
        """`POST /cascade`: one instance (the cloud servable's method's inputs) through the edge-cloud cascade."""
        if request.method != "POST":
            raise Failure("http message only support POST right now", 405, "protocol")
        if self.cascade is None:
            raise Failure("this server has no edge-cloud cascade; start mindvl serve with --cascade-edge PKG (an "
                          "exported package that answers on this machine as a device would)", 404, "not_found")
        async with self._held_body(request) as body:
            try:
                instances = parse_request(body, 1, PARSE_FACTOR * self._request_limit)
            except ProtocolError as error:
                raise self._protocol_failure(error) from None
        try:
            result = await asyncio.wait_for(self.cascade.answer(instances[0]), self.config.timeout_s)
        except ValueError as error:  # a bad instance (InputError, ConfigError)
            self.metrics.errors.labels("instance").inc()
            raise Failure(str(error), 400, "instance") from None
        except asyncio.TimeoutError:
            raise Failure(f"the cascade did not answer within {self.config.timeout_s:g} s (--timeout-s)", 504,
                          "timeout") from None
        return self._json(json.dumps(result).encode())

    @property
    def _request_limit(self) -> int:
        return int(self.config.max_request_mb * MB)

    @contextlib.asynccontextmanager
    async def _held_body(self, request: web.Request):
        """The request's body, its bytes held in the budget (max_inflight_mb) until the block ends: its declared
        Content-Length, or max_request_mb when the length is undeclared or the body compressed (aiohttp bounds a
        decoded body by client_max_size)."""
        limit = self._request_limit
        declared = request.content_length
        if declared is not None and declared > limit:  # refused before a byte of it is read
            raise self._too_large()
        compressed = request.headers.get("Content-Encoding", "identity").lower() != "identity"
        size = limit if declared is None or compressed else declared
        try:
            await asyncio.wait_for(self.bodies.acquire(size), self.config.timeout_s)
        except asyncio.TimeoutError:
            self.metrics.errors.labels("busy").inc()
            raise Failure(f"the server is busy: {self.config.max_inflight_mb:g} MB of request bodies are being served "
                          f"(--max-inflight-mb) and no room came free within {self.config.timeout_s:g} s; retry later",
                          503, "busy") from None
        try:
            try:
                body = await self._read_body(request)
            except ProtocolError as error:
                raise self._protocol_failure(error) from None
            yield body
        finally:
            self.bodies.release(size)

    # ---- generation: Server-Sent Events and the OpenAI chat API ------------------------------------------

    def _generative(self, servable: str, version: int) -> LoadedVersion:
        loaded = self.catalog.get(servable, version)
        if loaded.batcher is None:
            raise Failure(f"servable {servable} does not generate (it has {', '.join(sorted(loaded.methods))}); "
                          f"deploy a generative model package to stream answers", 400, "protocol")
        return loaded

    async def _generate_events(self, request: web.Request, servable: str, version: int,
                               instances: List[Dict[str, Any]]) -> web.StreamResponse:
        """`:generate` with `Accept: text/event-stream`: one instance's deltas as Server-Sent Events
        ({"text", "token", "finish_reason"}), then `data: [DONE]`."""
        if len(instances) != 1:
            raise Failure(f"a streamed generate takes one instance, got {len(instances)}", 400, "protocol")
        loaded = self._generative(servable, version)
        with self.catalog.using(loaded):
            try:
                generation = await loaded.start_generation(instances[0], self.pool)
            except InstanceError as error:
                raise Failure(str(error), 400, "instance") from None
            return await self._stream(request, generation, lambda d: O.Completion.event(
                {"text": d.text, "token": d.token, "logprob": d.logprob, "finish_reason": d.finish}), O.DONE)

    async def _stream(self, request: web.Request, generation, event, done: bytes, first: bytes = b"",
                      last=lambda: b"") -> web.StreamResponse:
        """Write `generation`'s deltas as events while they come; a client that goes away cancels it."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        watcher = asyncio.create_task(self._watch(request, generation))
        try:
            await response.prepare(request)
            if first:
                await response.write(first)
            try:
                async for delta in generation.stream():
                    await response.write(event(delta))
                await response.write(last() + done)
            except (ConfigError, RuntimeError, ValueError) as error:  # generation failed it: said in the stream
                await response.write(O.Completion.event({"error": {"message": str(error), "type": "server_error"}}))
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            self.metrics.errors.labels("disconnected").inc()
        finally:
            watcher.cancel()
            generation.cancel()
        return response

    async def _watch(self, request: web.Request, generation) -> None:
        """Cancel `generation` as soon as its client's connection closes (not only at the next write: a token
        may be long in coming)."""
        while not generation.cancelled:
            transport = request.transport
            if transport is None or transport.is_closing():
                self.metrics.errors.labels("disconnected").inc()
                generation.cancel()
                return
            await asyncio.sleep(WATCH_S)

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            if request.method != "GET":
                raise O.OpenAIError("use GET for /v1/models", 405, code="method_not_allowed")
            names = sorted(name for name, versions in self.catalog.loaded.items()
                           if versions and versions[max(versions)].batcher is not None)
            return web.Response(body=O.models_list(names), content_type="application/json")
        if request.method != "POST":
            raise O.OpenAIError("use POST for /v1/chat/completions", 405, code="method_not_allowed")
        async with self._held_body(request) as body:
            model, instance, stream, include_usage = O.parse_chat(body)
            name, _, version = model.partition("@")
            try:
                loaded = self._generative(name, int(version or 0))
            except (NotAvailable, ValueError):
                raise O.OpenAIError(f"The model {model!r} does not exist; GET /v1/models lists the served models",
                                    404, "model", "model_not_found") from None
            except Failure as failure:
                raise O.OpenAIError(str(failure), 400, "model", "model_not_generative") from None
            with self.catalog.using(loaded):
                try:
                    generation = await loaded.start_generation(instance, self.pool)
                except InstanceError as error:
                    param = next((p for p in ("max_tokens", "temperature", "top_p", "stop", "seed")
                                  if p in str(error)), None)
                    raise O.OpenAIError(str(error), 400, param, "invalid_value") from None
                completion = O.Completion(model)
                if stream:
                    count = [0]

                    def event(delta):
                        count[0] += 1
                        text = completion.chunk({"content": delta.text}) if delta.text else b""
                        return text + (completion.chunk({}, delta.finish) if delta.finish else b"")
                    return await self._stream(
                        request, generation, event, O.DONE, completion.chunk({"role": "assistant", "content": ""}),
                        lambda: completion.usage_chunk(generation.prompt_tokens, count[0]) if include_usage else b"")
                try:
                    result = await asyncio.wait_for(generation.result(), self.config.timeout_s)
                except asyncio.TimeoutError:
                    raise O.OpenAIError(f"generation timed out after {self.config.timeout_s:g} s (--timeout-s)", 504,
                                        code="timeout", kind="server_error") from None
                finally:
                    generation.cancel()
                return web.Response(body=completion.whole(result.text, result.finish, result.prompt_tokens,
                                                          len(result.tokens)), content_type="application/json")

    async def _openai_answer(self, request: web.Request) -> web.StreamResponse:
        """The OpenAI API's reply, its errors as OpenAI error objects with their HTTP status."""
        try:
            return await self._openai(request)
        except O.OpenAIError as error:
            self.metrics.errors.labels("openai").inc()
            return web.Response(body=error.body(), status=error.status, content_type="application/json")
        except Failure as failure:
            error = O.OpenAIError(str(failure), failure.status, kind="invalid_request_error" if failure.status < 500
                                  else "server_error")
            return web.Response(body=error.body(), status=error.status, content_type="application/json")

    def _protocol_failure(self, error: ProtocolError) -> Failure:
        self.metrics.errors.labels("protocol").inc()
        return Failure(f"Parser request failed, {error}", 400, "protocol")

    def _too_large(self) -> Failure:
        self.metrics.errors.labels("too_large").inc()
        return Failure(f"request body exceeds {self.config.max_request_mb:g} MB (--max-request-mb)", 413, "too_large")

    async def _read_body(self, request: web.Request) -> bytes:
        """The request's body, within timeout_s (a client that sends it a byte at a time is cut off, counted);
        one past max_request_mb as it arrives (undeclared or understated) is refused; one whose bytes do not
        decode as its Content-Encoding says is a protocol error; a client gone before the end is counted."""
        try:
            return await asyncio.wait_for(request.read(), self.config.timeout_s)
        except asyncio.TimeoutError:
            self.metrics.errors.labels("slow_body").inc()
            raise Failure(f"the request body did not arrive within {self.config.timeout_s:g} s (--timeout-s)", 408,
                          "slow_body") from None
        except ConnectionResetError:  # nobody to answer: counted, without the traceback of an internal error
            self.metrics.errors.labels("disconnected").inc()
            raise Failure("the client closed the connection before its body arrived", 400, "disconnected") from None
        except web.HTTPRequestEntityTooLarge:
            raise self._too_large() from None
        except web.RequestPayloadError as error:
            encoding = request.headers.get("Content-Encoding", "identity")
            raise ProtocolError(f"the body is not valid Content-Encoding {encoding} ({error.__cause__ or error}); "
                                "send it uncompressed or encoded as labelled") from None

    def _status_page(self, path: str) -> web.Response:
        if path == "/metrics":
            return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
        if path == "/health":
            return web.json_response({"status": "alive"})
        state = self.catalog.state()
        if path == "/servables":
            return web.json_response({"servables": state})
        waiting = [name for name, entry in state.items() if entry["default_version"] is None]
        ready = self.ready and bool(state) and not waiting  # an empty servable directory serves nothing
        return web.json_response({"ready": ready, "not_loaded": waiting}, status=200 if ready else 503)

    async def _admin(self, request: web.Request, name: str, version_text: str, action: str) -> web.Response:
        if self.admin_token is None:
            self.metrics.errors.labels("admin_off").inc()
            raise Failure("the admin endpoints are off; start mindvl serve with --admin-token-file PATH or "
                          "--admin-token-env VAR to load and unload versions over HTTP", 403, "admin_off")
        if not authorized(request.headers.get("Authorization", ""), self.admin_token):
            self.metrics.errors.labels("unauthorized").inc()
            raise Failure("the admin endpoints need the header 'Authorization: Bearer <token>' with the token of "
                          "--admin-token-file or --admin-token-env", 401, "unauthorized")
        version = int(version_text)
        if not 1 <= version <= MAX_VERSION:
            raise Failure(f"version {version}: expected 1..{MAX_VERSION}", 400, "protocol")
        try:
            if action == "load":
                await self.catalog.load(name, version)
            else:
                await self.catalog.unload(name, version)
        except (ServableError, PackageError, ValueError, OSError) as error:  # ValueError: ProtocolError
            status = 404 if isinstance(error, NotAvailable) else 400
            raise Failure(f"{action} servable {name} version {version}: {error}", status, "admin") from None
        self._update_loaded()
        return web.json_response({"servable": name, "version": version, "action": action,
                                  "state": self.catalog.state().get(name)})

    # ---- gRPC -----------------------------------------------------------------------------------------

    async def _grpc_predict(self, request, context) -> Any:
        spec = request.servable_spec
        try:
            if len(request.instances) > self.config.max_instances:  # before a tensor is converted
                raise too_many_instances(self.config.max_instances, len(request.instances))
            servable, method, version, instances = G.request_to_instances(request)
        except ProtocolError as error:
            self.metrics.errors.labels("protocol").inc()
            return G.reply_from_error(spec, ProtocolError(f"Parser request failed, {error}"))
        try:
            results, served = await self.predict(servable, version, method, instances, "grpc")
        except Failure as failure:
            error = ProtocolError(str(failure)) if failure.status < 500 else InstanceError(str(failure))
            return G.reply_from_error(spec, error)
        answered = G.ServableSpec(name=servable, method_name=method, version_number=served)
        return G.reply_from_results(answered, results)

    async def _grpc_predict_stream(self, request, context):
        """MSService/PredictStream: one `generate` instance's deltas, a PredictReply each as they are generated.
        A refused request ends with a status and no reply (NOT_FOUND: no such servable or version; INVALID_ARGUMENT:
        a bad request or instance, another method, a servable that does not generate); the initial metadata goes
        out once the generation is queued. A client that cancels or goes away cancels the generation at the
        next decode step (counted `disconnected`); a generation failure mid-stream ends it ABORTED (the version was
        unloaded while it ran: retry) or INTERNAL."""
        try:
            servable, method, version, instance = G.stream_request_to_instance(request)
            if method != GENERATE:
                raise ProtocolError(f"PredictStream streams method {GENERATE}, not {method}; call Predict for it")
            loaded = self._generative(servable, version)
        except (ProtocolError, Failure) as error:  # NotAvailable is a ProtocolError
            missing = isinstance(error, NotAvailable)
            self.metrics.errors.labels("not_found" if missing else "protocol").inc()
            await context.abort(grpc.StatusCode.NOT_FOUND if missing else grpc.StatusCode.INVALID_ARGUMENT, str(error))
        with self.catalog.using(loaded):
            try:
                generation = await loaded.start_generation(instance, self.pool)
            except InstanceError as error:
                self.metrics.errors.labels("instance").inc()
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            spec = G.ServableSpec(name=servable, method_name=method, version_number=loaded.version)
            try:
                await context.send_initial_metadata(())
                async for delta in generation.stream():
                    yield G.stream_reply(spec, delta.text, delta.token, delta.logprob, delta.finish)
            except (asyncio.CancelledError, GeneratorExit):  # grpc cancels the handler, or closes it, for a gone client
                self.metrics.errors.labels("disconnected").inc()
                raise
            except (ConfigError, RuntimeError, ValueError) as error:  # generation failed it
                await context.abort(grpc.StatusCode.ABORTED if isinstance(error, ConfigError)
                                    else grpc.StatusCode.INTERNAL, str(error))
            finally:
                generation.cancel()


# ---- running ------------------------------------------------------------------------------------------

def _return_large_frees() -> None:
    """Have glibc hand every block of 4 MB or more back to the system when it is freed, so that the process's
    RSS follows what is alive. By default glibc raises that threshold once a large block is freed, and freed
    image buffers then stay in each worker thread's arena: with one decode slot and 4 workers, RSS grew by
    4 x 128 MB for 4096x4096 images, not 128 MB (measured). Not glibc (no libc.so.6): nothing to do."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 4 * MB)
    except (OSError, AttributeError):
        pass


def serve(config: ServeConfig, cascade: Optional[Callable[[str], D.CascadeService]] = None) -> None:
    """Run the server until SIGINT or SIGTERM (the `mindvl serve` command). A directory with no servable yet is
    served (a deploy is picked up within poll_s) and said so; with polling off it would serve nothing ever,
    and is refused. cascade: makes the demo's edge-cloud cascade from this server's REST URL (its cloud), once
    the server listens."""
    if not list_servables(config.validate().servable_dir):
        deploy = f"`mindvl deploy PKG --servable-dir {config.servable_dir} --name NAME`"
        if not config.poll_s:
            raise ConfigError(f"servable_dir: {config.servable_dir} holds no servable (no <name>/{CONFIG_FILE}) and "
                              f"poll_s is 0, so none would ever be served; deploy one first with {deploy}")
        print(f"mindvl serve: {config.servable_dir} holds no servable yet; {deploy} adds one, served within "
              f"{config.poll_s:g} s", flush=True)

    async def main() -> None:
        server = Server(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await server.start()
            if cascade is not None:
                server.attach_cascade(await loop.run_in_executor(None, cascade, server.rest_url))
            print(f"mindvl serve: REST http://{config.host}:{server.rest_port}"
                  + (f", gRPC {config.host}:{server.grpc_port}" if server.grpc_port else ", gRPC off")
                  + f"; servables: {json.dumps({n: e['default_version'] for n, e in server.catalog.state().items()})}",
                  flush=True)
            if config.demo:
                print(f"mindvl serve: demo page {server.rest_url}/"
                      + (f" (edge-cloud cascade: {server.cascade.service.describe()['edge']})" if server.cascade
                         else ""), flush=True)
            await stop.wait()
        finally:
            await server.stop()

    asyncio.run(main())


class BackgroundServer:
    """A Server on its own event loop thread: `with BackgroundServer(config) as server: server.rest_url`
    (tests, benchmarks, quickstart). Entering waits until the initial versions are loaded."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.server: Optional[Server] = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mindvl-serve", daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        try:
            self.server = self.call(self._create())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.server

    async def _create(self) -> Server:
        server = Server(self.config)
        await server.start()
        return server

    def call(self, coroutine, timeout: Optional[float] = None):
        """Run a coroutine on the server's loop from another thread; -> its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.call(self.server.stop(), timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=60)
        self.loop.close()
