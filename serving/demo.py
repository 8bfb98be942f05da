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
"""
import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Optional, Protocol

from aiohttp import web

from mindvl.preprocess import MAX_IMAGE_SIDE

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


def asset(path: str) -> web.Response:
    """One of the page's files (read on each request: a few KB, and an edited file shows at once)."""
    name, kind = ASSETS[path]
    return web.Response(body=(FOLDER / name).read_bytes(), content_type=kind, charset="utf-8",
                        headers={"Cache-Control": "no-cache"})


def settings(max_request_mb: float, cascade: Optional[CascadeService]) -> web.Response:
    """What the page checks before it sends: the largest body, the largest image side, and the cascade (or null)."""
    return web.json_response({"max_request_mb": max_request_mb, "max_image_side": MAX_IMAGE_SIDE,
                              "cascade": cascade.describe() if cascade is not None else None})


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

