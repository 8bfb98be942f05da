"""`mindvl serve`: MindSpore Serving 2.0's REST and gRPC protocols over a servable directory, in one event loop.

Here the one application, `Server`, is assembled: what every route shares (the catalog of loaded versions, the
dynamic batchers, the worker pool for Python stages, the budget of request bodies, the metrics), the listeners
(REST on aiohttp behind admission.py's connection guard, gRPC on grpc.aio), the dispatch of each REST request
to its route by path, and the run loop (`serve`, the command; `BackgroundServer`, on a thread of its own).
The routes, one module per protocol, take the Server:
  rest_routes.py    POST /model/<servable>[/version/<n>]:<method>, MindSpore Serving's REST; a generative
                    servable's `generate` streams Server-Sent Events when asked with `Accept: text/event-stream`
  grpc_service.py   MSService/Predict, MindSpore Serving's gRPC, and mindvl's streaming PredictStream
  openai_routes.py  POST /v1/chat/completions, GET /v1/models: the OpenAI chat API over the generative servables
  status_routes.py  GET /health (liveness), /ready (200 once there are servables and each has a loaded version,
                    else 503), /metrics (Prometheus text), /servables (every servable's versions, JSON)
  demo.py           GET / the demo page (off with demo=False, `mindvl serve --no-demo`), POST /cascade one
                    instance through the edge-cloud cascade (`--cascade-edge PKG`)
  admin_routes.py   POST /servables/<name>/version/<n>:load|unload, off unless an admin token is configured
What several routes share: failures.py (a request's Failure), predict.py (asking the catalog), rest_bodies.py (a
REST body in, a JSON reply out), event_stream.py (a generation as Server-Sent Events), metrics.py.
A new version folder (`mindvl deploy`) is noticed within `poll_s` and loaded while the old one serves.
Errors answer {"error_msg": ...} with their HTTP status (a refused request 4xx, a missing servable 404, an admin
refusal 401/403), except MindSpore Serving's own predict replies, which answer HTTP 200 as it does unless
`strict_http` (rest_routes.serving_protocol); the OpenAI routes answer OpenAI error objects with their status.
What a client may hold (connections, request heads, bodies, decodes) is bounded: see `ServeConfig` and
admission.py; docs/serving.md states the memory bound that follows.
"""
import asyncio
import ctypes
import json
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

import grpc
from aiohttp import web

from mindvl.errors import ConfigError
from mindvl.package_reader import read_key
from mindvl.preprocess import limit_decodes
from mindvl.serving import admin_routes, demo, grpc_service, openai_routes, rest_routes, status_routes
from mindvl.serving.admission import BodyBudget, Connections, read_admin_token
from mindvl.serving.batching import BatchPolicy
from mindvl.serving.catalog import Catalog
from mindvl.serving.continuous_batching import GenerationOptions
from mindvl.serving.failures import Failure, failure_of
from mindvl.serving.metrics import Metrics
from mindvl.serving.protocol import encode_error
from mindvl.serving.rest_bodies import json_reply
from mindvl.serving.servable import CONFIG_FILE, list_servables
from mindvl.serving.serve_config import MB, ServeConfig

LOG = logging.getLogger("mindvl.serving")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
STOP_GRACE_S = 5.0  # how long a stopping server lets the requests in progress finish (a slow client held it 60 s)


class Server:
    """The REST and gRPC servers over one catalog; `start` and `stop` from a running event loop. The routes
    read what they share from its attributes: config, catalog, metrics, pool, batching, bodies, admin_token,
    cascade and ready."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config.validate()
        self.key = read_key(config.key_file or None, config.key_env or None)
        self.admin_token = read_admin_token(config.admin_token_file, config.admin_token_env)
        self.catalog = Catalog(Path(config.servable_dir), self.key, config.max_batch_size if config.batching else 1,
                               GenerationOptions(config.prefix_cache_mb, config.speculative_tokens,
                                                 config.max_wait_ms))
        self.metrics = Metrics()
        self.metrics.watch_generation(lambda: self.catalog.loaded)
        self.catalog.routed = lambda name, version: self.metrics.routed.labels(name, str(version)).inc()
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
        self.cascade: Optional[demo.CascadeEndpoint] = None

    def attach_cascade(self, service: demo.CascadeService) -> None:
        """Answer `POST /cascade` through `service` (whose cloud is usually this server: attach it once the
        server listens); the server closes it when it stops."""
        self.cascade = demo.CascadeEndpoint(service)

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
        app = web.Application(client_max_size=config.max_request_bytes)
        app.router.add_route("*", "/{path:.*}", self._route)
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=config.keepalive_s,
                                     shutdown_timeout=STOP_GRACE_S)
        await self._runner.setup()
        self._connections = Connections(self._runner.server, config.max_connections, config.header_timeout_s,
                                        lambda kind: self.metrics.errors.labels(kind).inc())
        self.metrics.connections.set_function(lambda: len(self._connections.open))
        self._listener = await asyncio.get_running_loop().create_server(self._connections, config.host, config.port)
        self.rest_port = self._listener.sockets[0].getsockname()[1]
        if config.grpc_port >= 0:
            self._grpc = grpc_service.build(self)
            self.grpc_port = self._grpc.add_insecure_port(f"{config.host}:{config.grpc_port}")
            if self.grpc_port == 0:
                raise OSError(f"gRPC: cannot listen on {config.host}:{config.grpc_port} (in use?)")
            await self._grpc.start()
        LOG.info("REST on http://%s:%d%s", config.host, self.rest_port,
                 f", gRPC on {config.host}:{self.grpc_port}" if self._grpc else "")
        await self.catalog.refresh()
        self.metrics.count_loaded(self.catalog.loaded)
        self.ready = True
        if config.poll_s > 0:
            self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_s)
            try:
                if await self.catalog.refresh():
                    self.metrics.count_loaded(self.catalog.loaded)
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

    # ---- REST: each request to its route ---------------------------------------------------------------

    async def _route(self, request: web.Request) -> web.StreamResponse:
        """The route of the request's path; any failure answered as MindSpore Serving's {"error_msg"}, with its
        status (HTTP 200 where the predict protocol keeps it: rest_routes.serving_protocol)."""
        path = request.path
        with self._connections.handling(request):
            try:
                if path.startswith("/model/") or path == "/model":
                    return await rest_routes.answer(self, request)
                if path in openai_routes.PATHS:
                    return await openai_routes.answer(self, request)
                if request.method == "GET" and path in status_routes.PATHS:
                    return status_routes.answer(self, path)
                if self.config.demo and request.method == "GET" and path in demo.PATHS:
                    return demo.page(self, path)
                if path == demo.CASCADE:
                    return await demo.answer_cascade(self, request)
                match = admin_routes.URL.fullmatch(path)
                if match and request.method == "POST":
                    return await admin_routes.answer(self, request, *match.groups())
                match = admin_routes.TRAFFIC.fullmatch(path)
                if match and request.method == "POST":
                    return await admin_routes.traffic(self, request, match.group(1))
                raise Failure(f"please check url: {request.method} {path[:64]!r} is not served; predict with "
                              f"POST /model/<servable>[/version/<n>]:<method>, POST /v1/chat/completions, or GET "
                              f"/health, /ready, /metrics, /servables, /v1/models"
                              + (", / (the demo page)" if self.config.demo else ""), 404, "protocol")
            except Exception as error:
                failure = failure_of(error)
                return json_reply(self, encode_error(str(failure)), failure.status,
                                  rest_routes.serving_protocol(path))


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


def serve(config: ServeConfig, cascade: Optional[Callable[[str], demo.CascadeService]] = None) -> None:
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
