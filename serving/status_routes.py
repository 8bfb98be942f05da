"""The status routes, for probes and dashboards: `GET /health` (the process answers), `GET /ready` (200 once
there are servables and each has a loaded version, else 503), `GET /metrics` (Prometheus text) and
`GET /servables` (every servable's versions and their status, JSON).

The route takes the `Server` (server.py): its catalog, metrics and whether its first load is done.
"""
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PATHS = ("/health", "/ready", "/metrics", "/servables")


def answer(server, path: str) -> web.Response:
    if path == "/metrics":
        return web.Response(body=generate_latest(server.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
    if path == "/health":
        return web.json_response({"status": "alive"})
    state = server.catalog.state()
    if path == "/servables":
        return web.json_response({"servables": state})
    waiting = [name for name, entry in state.items() if entry["default_version"] is None]
    ready = server.ready and bool(state) and not waiting  # an empty servable directory serves nothing
    return web.json_response({"ready": ready, "not_loaded": waiting}, status=200 if ready else 503)
