"""`Failure`: a whole request that failed, as every route answers it: the client's message, the HTTP status of
strict mode (MindSpore Serving answers HTTP 200 with {"error_msg"}), and the kind counted in `mindvl_errors`.

`failure_of` maps any exception a request raised to one, so that an internal error is named to the client and
logged, never raised out of a route.
"""
import asyncio
import logging

from mindvl.errors import plain
from mindvl.serving.catalog import NotAvailable
from mindvl.serving.protocol import ProtocolError
from mindvl.serving.runtime import MethodNotFound

LOG = logging.getLogger("mindvl.serving")


class Failure(Exception):
    """A whole request failed: the message for the client and the HTTP status of strict mode."""

    def __init__(self, message: str, status: int, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def failure_of(error: BaseException) -> Failure:
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
    return Failure(plain(f"internal error: {type(error).__name__}: {error}"), 500, "internal")
