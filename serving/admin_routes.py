"""The admin routes: `POST /servables/<name>/version/<n>:load|unload` loads a version (it becomes the default
when newest) or unloads one (its running requests finish first); `POST /servables/<name>:traffic` splits the
servable's default traffic between its loaded versions by weight (a gray release). They are off unless an admin token is
configured (`--admin-token-file`, `--admin-token-env`), then answered only with `Authorization: Bearer <token>`
(admission.py reads and compares it).

The route takes the `Server` (server.py): its token, catalog and metrics.
"""
import re

from aiohttp import web

from mindvl.errors import PackageError
from mindvl.serving.admission import authorized
from mindvl.serving.catalog import NotAvailable
from mindvl.serving.failures import Failure
from mindvl.serving.protocol import MAX_VERSION
from mindvl.serving.register import MissingServable, ServableError

URL = re.compile(r"/servables/([^/]+)/version/([0-9]{1,10}):(load|unload)")
TRAFFIC = re.compile(r"/servables/([^/]+):traffic")


def _admitted(server, request: web.Request) -> None:
    """Failure unless the admin endpoints are on and the request carries their token."""
    if server.admin_token is None:
        server.metrics.errors.labels("admin_off").inc()
        raise Failure("the admin endpoints are off; start mindvl serve with --admin-token-file PATH or "
                      "--admin-token-env VAR to load and unload versions over HTTP", 403, "admin_off")
    if not authorized(request.headers.get("Authorization", ""), server.admin_token):
        server.metrics.errors.labels("unauthorized").inc()
        raise Failure("the admin endpoints need the header 'Authorization: Bearer <token>' with the token of "
                      "--admin-token-file or --admin-token-env", 401, "unauthorized")


async def answer(server, request: web.Request, name: str, version_text: str, action: str) -> web.Response:
    """`action` ("load" or "unload") on version `version_text` of servable `name` (the groups of URL)."""
    _admitted(server, request)
    version = int(version_text)
    if not 1 <= version <= MAX_VERSION:
        raise Failure(f"version {version}: expected 1..{MAX_VERSION}", 400, "protocol")
    try:
        if action == "load":
            await server.catalog.load(name, version)
        else:
            await server.catalog.unload(name, version)
    except (ServableError, PackageError, ValueError, OSError) as error:  # ValueError: ProtocolError
        status = 404 if isinstance(error, (NotAvailable, MissingServable)) else 400
        raise Failure(f"{action} servable {name} version {version}: {error}", status, "admin") from None
    server.metrics.count_loaded(server.catalog.loaded)
    return web.json_response({"servable": name, "version": version, "action": action,
                              "state": server.catalog.state().get(name)})


async def traffic(server, request: web.Request, name: str) -> web.Response:
    """`POST /servables/<name>:traffic` {"weights": {"1": 90, "2": 10}}: the gray release's split of the servable's
    default traffic between its loaded versions (`{}` or null: the newest takes it all)."""
    _admitted(server, request)
    try:
        body = await request.json()
        weights = body.get("weights") or {}
        if not isinstance(weights, dict):
            raise ValueError("traffic: weights must be an object of version -> weight")
        server.catalog.set_traffic(name, {_version(key): value for key, value in weights.items()})
    except (ValueError, AttributeError) as error:  # ValueError: bad JSON, NotAvailable (a ProtocolError) too
        status = 404 if isinstance(error, NotAvailable) else 400
        message = str(error) if isinstance(error, ValueError) and str(error).startswith(("traffic", "servable")) \
            else f"traffic: expected {{\"weights\": {{\"<version>\": <weight>, ...}}}} ({error})"
        raise Failure(message, status, "admin") from None
    return web.json_response({"servable": name, "traffic": server.catalog.state().get(name, {}).get("traffic")})


def _version(key: str) -> int:
    if not isinstance(key, str) or not key.isdigit() or not 1 <= int(key) <= MAX_VERSION:
        raise ValueError(f"traffic: version {key!r}: expected 1..{MAX_VERSION}")
    return int(key)
