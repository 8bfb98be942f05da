"""The gRPC front door: MindSpore Serving's `MSService/Predict` and mindvl's server-streaming `PredictStream`
on a grpc.aio server (grpc_protocol.py holds the messages, the tensor codec and the handler registration).

The handlers take the `Server` (server.py); `build` makes the grpc server that server.py binds and starts.
"""
import asyncio
import functools
from typing import Any, Optional

import grpc

from mindvl.errors import ConfigError
from mindvl.serving import grpc_protocol as G
from mindvl.serving.catalog import NotAvailable
from mindvl.serving.failures import Failure
from mindvl.serving.predict import CLIENT_HEADER, generative, predict
from mindvl.serving.protocol import InstanceError, ProtocolError, too_many_instances
from mindvl.serving.register import GENERATE
from mindvl.serving.serve_config import ServeConfig


def build(server) -> grpc.aio.Server:
    """A grpc.aio server answering both rpcs for `server`, its messages bounded by max_request_mb and its calls
    in progress by `concurrent_calls`; not yet listening."""
    size = server.config.max_request_bytes
    service = grpc.aio.server(options=[("grpc.max_receive_message_length", size),
                                       ("grpc.max_send_message_length", size)],
                              maximum_concurrent_rpcs=concurrent_calls(server.config))
    G.add_predict_handler(service, functools.partial(predict_rpc, server))
    G.add_predict_stream_handler(service, functools.partial(predict_stream_rpc, server))
    return service


def concurrent_calls(config: ServeConfig) -> int:
    """gRPC calls in progress at once: grpc receives a whole message before mindvl sees it, so the bodies'
    budget bounds gRPC by count, each call taken at the largest size (more are refused RESOURCE_EXHAUSTED)."""
    return int(config.max_inflight_mb // config.max_request_mb)


async def predict_rpc(server, request, context) -> Any:
    """MSService/Predict: the request's instances answered as MindSpore Serving's PredictReply, errors in it."""
    spec = request.servable_spec
    try:
        if len(request.instances) > server.config.max_instances:  # before a tensor is converted
            raise too_many_instances(server.config.max_instances, len(request.instances))
        servable, method, version, instances = G.request_to_instances(request)
    except ProtocolError as error:
        server.metrics.errors.labels("protocol").inc()
        return G.reply_from_error(spec, ProtocolError(f"Parser request failed, {error}"))
    try:
        results, served = await predict(server, servable, version, method, instances, "grpc", _client(context))
    except Failure as failure:
        error = ProtocolError(str(failure)) if failure.status < 500 else InstanceError(str(failure))
        return G.reply_from_error(spec, error)
    answered = G.ServableSpec(name=servable, method_name=method, version_number=served)
    return G.reply_from_results(answered, results)


async def predict_stream_rpc(server, request, context):
    """MSService/PredictStream: one `generate` instance's deltas, a PredictReply each as they are generated.
    A refused request ends with a status and no reply (NOT_FOUND: no such servable or version; INVALID_ARGUMENT:
    a bad request or instance, another method, a servable that does not generate); the initial metadata goes
    out once the generation is queued. A client that cancels or goes away cancels the generation at the
    next decode step (counted `disconnected`); a generation failure mid-stream ends it ABORTED (the version was
    unloaded while it ran: retry) or INTERNAL."""
    try:
        servable, method, version, instance = G.stream_request_to_instance(request)
        if method != GENERATE:
            raise ProtocolError(f"PredictStream streams method {GENERATE}, not {method}; call Predict for it")
        loaded = generative(server.catalog, servable, version, _client(context))
    except (ProtocolError, Failure) as error:  # NotAvailable is a ProtocolError
        missing = isinstance(error, NotAvailable)
        server.metrics.errors.labels("not_found" if missing else "protocol").inc()
        await context.abort(grpc.StatusCode.NOT_FOUND if missing else grpc.StatusCode.INVALID_ARGUMENT, str(error))
    with server.catalog.using(loaded):
        try:
            generation = await loaded.start_generation(instance, server.pool)
        except InstanceError as error:
            server.metrics.errors.labels("instance").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        spec = G.ServableSpec(name=servable, method_name=method, version_number=loaded.version)
        try:
            await context.send_initial_metadata(())
            async for delta in generation.stream():
                yield G.stream_reply(spec, delta.text, delta.token, delta.logprob, delta.finish)
        except (asyncio.CancelledError, GeneratorExit):  # grpc cancels the handler, or closes it, for a gone client
            server.metrics.errors.labels("disconnected").inc()
            raise
        except (ConfigError, RuntimeError, ValueError) as error:  # generation failed it
            await context.abort(grpc.StatusCode.ABORTED if isinstance(error, ConfigError)
                                else grpc.StatusCode.INTERNAL, str(error))
        finally:
            generation.cancel()


def _client(context) -> Optional[str]:
    """The client key of a call (its `x-client-key` metadata): a gray release keeps it on one version."""
    return dict(context.invocation_metadata() or ()).get(CLIENT_HEADER.lower())
