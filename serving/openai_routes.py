"""The OpenAI chat API's routes over the generative servables: `POST /v1/chat/completions` (whole or streamed
as Server-Sent Events) and `GET /v1/models`. openai_api.py reads the requests and writes the bodies; these
routes ask the catalog and answer every error as an OpenAI error object with its HTTP status.

The routes take the `Server` (server.py).
"""
import asyncio

from aiohttp import web

from mindvl.serving import openai_api as O
from mindvl.serving.catalog import NotAvailable
from mindvl.serving.event_stream import stream_events
from mindvl.serving.failures import Failure, failure_of
from mindvl.serving.predict import generative
from mindvl.serving.protocol import InstanceError
from mindvl.serving.rest_bodies import held_body

PATHS = ("/v1/chat/completions", "/v1/models")


async def answer(server, request: web.Request) -> web.StreamResponse:
    """The OpenAI API's reply, its errors as OpenAI error objects with their HTTP status."""
    try:
        return await _answer(server, request)
    except O.OpenAIError as error:
        server.metrics.errors.labels("openai").inc()
        return web.Response(body=error.body(), status=error.status, content_type="application/json")
    except Exception as raised:  # a Failure, or what failed the generation: named, logged when internal
        failure = failure_of(raised)
        error = O.OpenAIError(str(failure), failure.status, kind="invalid_request_error" if failure.status < 500
                              else "server_error")
        return web.Response(body=error.body(), status=error.status, content_type="application/json")


def _param(message: str):
    """The request field an instance error names (its messages start `field: ...`): a setting, or the question's
    text (its message part), image or clip."""
    field = message.partition(":")[0]
    if field in O.SETTINGS:
        return field
    return "messages" if field in ("text", "image", "audio") else None


async def _answer(server, request: web.Request) -> web.StreamResponse:
    if request.path == "/v1/models":
        if request.method != "GET":
            raise O.OpenAIError("use GET for /v1/models", 405, code="method_not_allowed")
        names = sorted(name for name, versions in server.catalog.loaded.items()
                       if versions and versions[max(versions)].batcher is not None)
        return web.Response(body=O.models_list(names), content_type="application/json")
    if request.method != "POST":
        raise O.OpenAIError("use POST for /v1/chat/completions", 405, code="method_not_allowed")
    async with held_body(server, request) as body:
        model, instance, stream, include_usage = O.parse_chat(body)
        name, _, version = model.partition("@")
        try:
            loaded = generative(server.catalog, name, int(version or 0))
        except (NotAvailable, ValueError):
            raise O.OpenAIError(f"The model {model!r} does not exist; GET /v1/models lists the served models",
                                404, "model", "model_not_found") from None
        except Failure as failure:
            raise O.OpenAIError(str(failure), 400, "model", "model_not_generative") from None
        with server.catalog.using(loaded):
            try:
                generation = await loaded.start_generation(instance, server.pool)
            except InstanceError as error:
                raise O.OpenAIError(str(error), 400, _param(str(error)), "invalid_value") from None
            completion = O.Completion(model)
            if stream:
                count = [0]

                def event(delta):
                    count[0] += 1
                    text = completion.chunk({"content": delta.text}) if delta.text else b""
                    return text + (completion.chunk({}, delta.finish) if delta.finish else b"")
                return await stream_events(
                    request, generation, server.metrics, event, O.DONE,
                    completion.chunk({"role": "assistant", "content": ""}),
                    lambda: completion.usage_chunk(generation.prompt_tokens, count[0]) if include_usage else b"")
            timeout_s = server.config.timeout_s
            try:
                result = await asyncio.wait_for(generation.result(), timeout_s)
            except asyncio.TimeoutError:
                raise O.OpenAIError(f"generation timed out after {timeout_s:g} s (--timeout-s)", 504,
                                    code="timeout", kind="server_error") from None
            finally:
                generation.cancel()
            return web.Response(body=completion.whole(result.text, result.finish, result.prompt_tokens,
                                                      len(result.tokens)), content_type="application/json")
