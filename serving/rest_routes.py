"""MindSpore Serving 2.0's REST route: `POST /model/<servable>[/version/<n>]:<method>` (protocol.py reads and
writes its JSON). A generative servable's `:generate` asked with `Accept: text/event-stream` answers one
instance's deltas as Server-Sent Events instead of one reply.

The route takes the `Server` (server.py); what it shares with the other routes (bodies, predict, the event
stream) is in rest_bodies.py, predict.py and event_stream.py.
"""
from typing import Any, Dict, List

from aiohttp import web

from mindvl.serving.event_stream import stream_events
from mindvl.serving.failures import Failure
from mindvl.serving.openai_api import DONE, Completion
from mindvl.serving.predict import CLIENT_HEADER, generative, predict
from mindvl.serving.protocol import InstanceError, ProtocolError, encode_reply, parse_url
from mindvl.serving.register import GENERATE
from mindvl.serving.rest_bodies import held_body, json_reply, parse_instances, protocol_failure


def serving_protocol(path: str) -> bool:
    """Whether the reply to `path` speaks MindSpore Serving's predict protocol (errors as HTTP 200 with
    {"error_msg"} unless strict_http): every /model path but mindvl's own `:generate`, whose errors, as every other
    route's, carry their status (a refused request 4xx, a missing servable 404)."""
    return (path == "/model" or path.startswith("/model/")) and not path.endswith(f":{GENERATE}")


async def answer(server, request: web.Request) -> web.StreamResponse:
    """One predict request, answered while its body's bytes are held in the budget (max_inflight_mb): its
    declared Content-Length, or max_request_mb when the length is undeclared or the body compressed
    (aiohttp bounds a decoded body by client_max_size)."""
    if request.method != "POST":
        raise Failure("http message only support POST right now", 405, "protocol")
    try:
        servable, version, method = parse_url(path=request.path)
    except ProtocolError as error:
        raise protocol_failure(server, error) from None
    async with held_body(server, request) as body:
        instances = parse_instances(server, body, server.config.max_instances)
        if method == GENERATE and "text/event-stream" in request.headers.get("Accept", ""):
            return await _generate_events(server, request, servable, version, instances)
        results, _ = await predict(server, servable, version, method, instances, "rest",
                                   request.headers.get(CLIENT_HEADER))
        return json_reply(server, encode_reply(results))


async def _generate_events(server, request: web.Request, servable: str, version: int,
                           instances: List[Dict[str, Any]]) -> web.StreamResponse:
    """`:generate` with `Accept: text/event-stream`: one instance's deltas as Server-Sent Events
    ({"text", "token", "logprob", "finish_reason"}, "top_logprobs" when asked, the first also "prompt_tokens" and
    "dropped_turns"), then `data: [DONE]`."""
    if len(instances) != 1:
        raise Failure(f"a streamed generate takes one instance, got {len(instances)}", 400, "protocol")
    loaded = generative(server.catalog, servable, version, request.headers.get(CLIENT_HEADER))
    with server.catalog.using(loaded):
        try:
            generation = await loaded.start_generation(instances[0], server.pool)
        except InstanceError as error:
            raise Failure(str(error), 400, "instance") from None
        first = {"prompt_tokens": generation.prompt_tokens, "dropped_turns": generation.dropped_turns}

        def event(delta) -> bytes:
            fields = {"text": delta.text, "token": delta.token, "logprob": delta.logprob,
                      "finish_reason": delta.finish, **first}
            if delta.top:
                fields["top_logprobs"] = [{"token": token, "logprob": logprob} for token, logprob in delta.top]
            first.clear()
            return Completion.event(fields)
        return await stream_events(request, generation, server.metrics, event, DONE)
