"""The demo page of `mindvl serve` (GET /), and the edge-cloud cascade it can ask.

The page is three static files shipped in the package (demo/: no build step, nothing fetched from elsewhere, so
a server without internet serves it whole). It is a client like any other: it lists the servables from
`GET /servables`, asks a classifier's `predict` and streams a generative servable's `generate` as Server-Sent
Events through the same REST URLs, and reads what it must know of this server (the largest request body, the
cascade) from `GET /demo/settings`.

The cascade runs where the device would: `mindvl serve --cascade-edge PKG` loads an edge package on this machine
(mindvl.lite's DevicePipeline; the serving layer knows it only through `CascadeService`) whose cloud is this very
server's REST endpoint, and `POST /cascade` answers one instance through it: from the edge when its calibrated
confidence reaches the threshold, else from the cloud, saying which.

The routes (`page`, `answer_cascade`) take the `Server` (server.py); it holds the cascade once one is attached.
"""
import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Protocol

from aiohttp import web

from mindvl.preprocess import MAX_IMAGE_SIDE
from mindvl.serving.failures import Failure
from mindvl.serving.rest_bodies import held_body, json_reply, parse_instances

FOLDER = Path(__file__).with_name("demo")
ASSETS = {"/": ("index.html", "text/html"), "/demo/demo.js": ("demo.js", "application/javascript"),
          "/demo/demo.css": ("demo.css", "text/css")}
SETTINGS = "/demo/settings"
CASCADE = "/cascade"
PATHS = tuple(ASSETS) + (SETTINGS,)


class CascadeService(Protocol):
    """What `POST /cascade` asks: an edge-cloud cascade over one instance (mindvl.lite.cascade.Cascade)."""

    def describe(self) -> Dict[str, Any]:
        """{"edge": the edge package's name, "method": "predict" or "generate", "servable": the cloud's servable,
        "threshold": the calibrated confidence at or above which the edge answers}."""

    def ask(self, instance: Dict[str, Any]) -> Dict[str, Any]:
        """One instance, as the servable's method takes it -> the answer, its confidence and its source ("edge",
        "cloud" or "edge_fallback"); ValueError or the device's errors for a bad instance. Blocks."""

    def close(self) -> None:
        """Release the edge's runtime."""


def page(server, path: str) -> web.Response:
    """`GET` of one of PATHS: a file of the page (read on each request: a few KB, and an edited file shows at
    once), or the settings the page checks before it sends: the largest body, the largest image side, and the
    cascade (or null)."""
    if path == SETTINGS:
        cascade = server.cascade.service.describe() if server.cascade is not None else None
        return web.json_response({"max_request_mb": server.config.max_request_mb, "max_image_side": MAX_IMAGE_SIDE,
                                  "cascade": cascade})
    name, kind = ASSETS[path]
    return web.Response(body=(FOLDER / name).read_bytes(), content_type=kind, charset="utf-8",
                        headers={"Cache-Control": "no-cache"})


async def answer_cascade(server, request: web.Request) -> web.Response:
    """`POST /cascade`: one instance (the cloud servable's method's inputs) through the edge-cloud cascade."""
    if request.method != "POST":
        raise Failure("http message only support POST right now", 405, "protocol")
    if server.cascade is None:
        raise Failure("this server has no edge-cloud cascade; start mindvl serve with --cascade-edge PKG (an "
                      "exported package that answers on this machine as a device would)", 404, "not_found")
    async with held_body(server, request) as body:
        instances = parse_instances(server, body, 1)
    try:
        result = await asyncio.wait_for(server.cascade.answer(instances[0]), server.config.timeout_s)
    except ValueError as error:  # a bad instance (InputError, ConfigError)
        server.metrics.errors.labels("instance").inc()
        raise Failure(str(error), 400, "instance") from None
    except asyncio.TimeoutError:
        raise Failure(f"the cascade did not answer within {server.config.timeout_s:g} s (--timeout-s)", 504,
                      "timeout") from None
    return json_reply(server, json.dumps(result).encode())


class CascadeEndpoint:
    """`POST /cascade`: one instance through the cascade, on a thread of its own (the edge runs one question at a
    time; its cloud requests come back into this server's event loop, which must stay free to answer them)."""

    def __init__(self, service: CascadeService) -> None:
        self.service = service
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="mindvl-cascade")
        self._lock = threading.Lock()

    async def answer(self, instance: Dict[str, Any]) -> Dict[str, Any]:
        def ask() -> Dict[str, Any]:
            with self._lock:
                return self.service.ask(instance)
        return await asyncio.get_running_loop().run_in_executor(self._thread, ask)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.service.close()

