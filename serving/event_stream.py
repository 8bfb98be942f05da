"""A generation's deltas written as Server-Sent Events while they come, for REST's streamed `:generate` and the
OpenAI API's `stream`: each route says how a delta reads as an event; a client that goes away cancels the
generation at once (watched, not only noticed at the next write), counted `disconnected` in the metrics.
"""
import asyncio
from typing import Callable, Union

from aiohttp import web

from mindvl.errors import ConfigError
from mindvl.serving.continuous_batching import Choices, GenerationRequest
from mindvl.serving.metrics import Metrics
from mindvl.serving.openai_api import Completion

WATCH_S = 0.05  # how often a streaming request's connection is checked


async def stream_events(request: web.Request, generation: Union[GenerationRequest, Choices], metrics: Metrics,
                        event: Callable[..., bytes], done: bytes, first: bytes = b"",
                        last: Callable[[], bytes] = lambda: b"") -> web.StreamResponse:
    """Write `generation`'s deltas (a request's, or its choices' as (index, delta)) as events while they come: `first`, then `event(delta)` each, then `last()`
    and `done`; a generation that fails says so in the stream; a client that goes away cancels it."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    watcher = asyncio.create_task(_watch(request, generation, metrics))
    try:
        await response.prepare(request)
        if first:
            await response.write(first)
        try:
            async for delta in generation.stream():
                await response.write(event(delta))
            await response.write(last() + done)
        except (ConfigError, RuntimeError, ValueError) as error:  # generation failed it: said in the stream
            await response.write(Completion.event({"error": {"message": str(error), "type": "server_error"}}))
        await response.write_eof()
    except (ConnectionResetError, ConnectionError):
        metrics.errors.labels("disconnected").inc()
    finally:
        watcher.cancel()
        generation.cancel()
    return response


async def _watch(request: web.Request, generation: Union[GenerationRequest, Choices], metrics: Metrics) -> None:
    """Cancel `generation` as soon as its client's connection closes (not only at the next write: a token
    may be long in coming)."""
    while not generation.cancelled:
        transport = request.transport
        if transport is None or transport.is_closing():
            metrics.errors.labels("disconnected").inc()
            generation.cancel()
            return
        await asyncio.sleep(WATCH_S)
