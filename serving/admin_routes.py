"""The admin routes: `POST /servables/<name>/version/<n>:load|unload` loads a version (it becomes the default
when newest) or unloads one (its running requests finish first). They are off unless an admin token is
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


async def answer(server, request: web.Request, name: str, version_text: str, action: str) -> web.Response:
    """`action` ("load" or "unload") on version `version_text` of servable `name` (the groups of URL)."""
    if server.admin_token is None:
        server.metrics.errors.labels("admin_off").inc()
        raise Failure("the admin endpoints are off; start mindvl serve with --admin-token-file PATH or "
                      "--admin-token-env VAR to load and unload versions over HTTP", 403, "admin_off")
    if not authorized(request.headers.get("Authorization", ""), server.admin_token):
        server.metrics.errors.labels("unauthorized").inc()
        raise Failure("the admin endpoints need the header 'Authorization: Bearer <token>' with the token of "
                      "--admin-token-file or --admin-token-env", 401, "unauthorized")
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
