"""The OpenAI API's routes: `POST /v1/chat/completions` (whole or streamed as Server-Sent Events) and `GET
/v1/models` over the generative servables, `POST /v1/embeddings` over the servables with a text embedding.
openai_api.py reads the requests and writes the bodies; these routes ask the catalog and answer every error as
an OpenAI error object with its HTTP status.

The routes take the `Server` (server.py).
"""
import asyncio
import functools
from typing import Optional

from aiohttp import web

from mindvl.preprocess.text import TextTokenizer

from mindvl.serving import openai_api as O
from mindvl.serving.catalog import NotAvailable
from mindvl.serving.event_stream import stream_events
from mindvl.serving.failures import Failure, failure_of
from mindvl.serving.predict import CLIENT_HEADER, generative, predict
from mindvl.serving.protocol import InstanceError
from mindvl.serving.rest_bodies import held_body

PATHS = ("/v1/chat/completions", "/v1/models", "/v1/embeddings")
EMBED = "embed_text"  # the method /v1/embeddings runs (a classifier package's text embedding graph)


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


def _param(message: str, chat: O.ChatRequest):
    """The request field an instance error names (its messages start `field: ...`): a setting, the field that
    asked for structured output, or the messages (a question's text, image, clip, the conversation)."""
    field = message.partition(":")[0]
    if field in O.SETTINGS:
        return field
    if field in ("json_schema", "json_object", "regex", "choice", "grammar"):
        return chat.grammar_field
    return "messages" if field in ("text", "image", "audio", "images", "images, video", "video", "history") else None


async def _answer(server, request: web.Request) -> web.StreamResponse:
    if request.path == "/v1/models":
        if request.method != "GET":
            raise O.OpenAIError("use GET for /v1/models", 405, code="method_not_allowed")
        names = sorted(name for name, versions in server.catalog.loaded.items()
                       if versions and versions[max(versions)].batcher is not None)
        return web.Response(body=O.models_list(names), content_type="application/json")
    if request.method != "POST":
        raise O.OpenAIError(f"use POST for {request.path}", 405, code="method_not_allowed")
    if request.path == "/v1/embeddings":
        return await _embeddings(server, request)
    async with held_body(server, request) as body:
        chat = O.parse_chat(body)
        name, _, version = chat.model.partition("@")
        try:
            loaded = generative(server.catalog, name, int(version or 0), _client(request, chat.user))
        except (NotAvailable, ValueError):
            raise O.OpenAIError(f"The model {chat.model!r} does not exist; GET /v1/models lists the served models",
                                404, "model", "model_not_found") from None
        except Failure as failure:
            raise O.OpenAIError(str(failure), 400, "model", "model_not_generative") from None
        with server.catalog.using(loaded):
            try:
                choices = await loaded.start_choices(chat.instance, server.pool, chat.n)
            except InstanceError as error:
                raise O.OpenAIError(str(error), 400, _param(str(error), chat), "invalid_value") from None
            tokenizer = loaded.batcher.layout.tokenizer
            completion = O.Completion(chat.model, lambda token: tokenizer.decode([token], skip_special_tokens=False))
            if chat.stream:
                count = [0]

                def event(item):
                    index, delta = item
                    count[0] += 1
                    return completion.delta_chunks(index, delta, chat.logprobs)
                first = b"".join(completion.chunk({"role": "assistant", "content": ""}, index=index,
                                                  dropped_turns=choices.dropped_turns) for index in range(chat.n))
                return await stream_events(
                    request, choices, server.metrics, event, O.DONE, first,
                    lambda: completion.usage_chunk(choices.prompt_tokens, count[0]) if chat.include_usage else b"")
            timeout_s = server.config.timeout_s
            try:
                results = await asyncio.wait_for(choices.results(), timeout_s)
            except asyncio.TimeoutError:
                raise O.OpenAIError(f"generation timed out after {timeout_s:g} s (--timeout-s)", 504,
                                    code="timeout", kind="server_error") from None
            finally:
                choices.cancel()
            return web.Response(body=completion.whole(results, chat.logprobs), content_type="application/json")


async def _embeddings(server, request: web.Request) -> web.Response:
    """`POST /v1/embeddings`: each input string through the servable's embed_text method (a package's text embedding
    graph, unit length), the tokens counted by the package's own tokenizer (every version of a servable shares it:
    servable.package_contract)."""
    async with held_body(server, request) as body:
        asked = O.parse_embeddings(body)
        name, _, version = asked.model.partition("@")
        versions = server.catalog.loaded.get(name)
        if not versions or not (version.isdigit() or not version):
            raise O.OpenAIError(f"The model {asked.model!r} does not exist; GET /servables lists the servables", 404,
                                "model", "model_not_found")
        newest = versions[max(versions)]
        if EMBED not in newest.methods or not ((newest.manifest or {}).get("preprocess") or {}).get("tokenizer"):
            raise O.OpenAIError(f"model {asked.model!r} has no text embedding (its methods: "
                                f"{', '.join(sorted(newest.methods))}); export a package with the text_embed graph",
                                400, "model", "model_not_embedding")
        try:
            results, _ = await predict(server, name, int(version or 0), EMBED, [{"text": t} for t in asked.texts],
                                       "openai", _client(request, asked.user))
        except Failure as failure:
            raise O.OpenAIError(str(failure), failure.status, "model" if failure.status == 404 else None) from None
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                raise O.OpenAIError(f"input[{index}]: {result}", 400, "input", "invalid_value")
        path = str(newest.folder / newest.manifest["preprocess"]["tokenizer"])
        tokens = await asyncio.get_running_loop().run_in_executor(  # CPU work: off the event loop
            server.pool, lambda: sum(map(_tokenizer(path).count, asked.texts)))
        return web.Response(body=O.embeddings_body(asked.model, [r["embedding"] for r in results], tokens,
                                                   asked.base64), content_type="application/json")


def _client(request: web.Request, user: Optional[str]) -> Optional[str]:
    """The client key a gray release keeps on one version: the X-Client-Key header, else OpenAI's `user` field."""
    return request.headers.get(CLIENT_HEADER) or user


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str) -> TextTokenizer:
    """A package's tokenizer (what its embed_text reads), loaded once per file."""
    return TextTokenizer.load(path)
