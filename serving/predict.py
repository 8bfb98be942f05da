"""What a request asks of the catalog, whichever protocol brought it: `predict` runs a servable's method on
instances (REST's `:predict`/`:generate` and gRPC's Predict), `generative` finds the version a streamed
generation starts on (REST's Server-Sent Events, the OpenAI API, gRPC's PredictStream). Both fail with
`Failure`, so that each protocol words the same failure its own way.

The functions take the `Server` (server.py) for its catalog, worker pool, batchers, settings and metrics.
"""
import asyncio
import time
from typing import Any, Dict, List, Optional, Tuple

from mindvl.serving.catalog import Catalog
from mindvl.serving.failures import Failure, failure_of
from mindvl.serving.metrics import Metrics
from mindvl.serving.runtime import LoadedVersion


CLIENT_HEADER = "X-Client-Key"  # a client's key: a gray release sends all its requests to one version


async def predict(server, servable: str, version: int, method: str, instances: List[Dict[str, Any]],
                  protocol: str, client: Optional[str] = None) -> Tuple[List[Any], int]:
    """The results of `instances` and the version that answered (version 0: the default, drawn by the servable's
    traffic split for `client`); raises Failure."""
    start = time.perf_counter()
    labels = ("", "", protocol)  # names become labels only once they exist (bounded label sets)
    try:
        loaded = server.catalog.get(servable, version, client)
        loaded.method(method)
        labels = (servable, method, protocol)
        with server.catalog.using(loaded):
            results = await asyncio.wait_for(loaded.run(method, instances, server.pool, server.batching),
                                             server.config.timeout_s)
    except asyncio.TimeoutError:
        failure = Failure(f"request timed out after {server.config.timeout_s:g} s (--timeout-s)", 504, "timeout")
        _count(server.metrics, labels, start, failure.kind)
        raise failure from None
    except Exception as error:
        failure = failure_of(error)
        _count(server.metrics, labels, start, failure.kind)
        raise failure from None
    failed = sum(isinstance(result, BaseException) for result in results)
    server.metrics.instances.labels(servable, method).inc(len(results))
    if failed == len(results) and loaded.manifest is None and len({str(r) for r in results}) == 1:
        # MindSpore Serving folds a request whose every instance failed alike into one error_msg; its
        # servables get that reply (mindvl packages keep an entry per instance, which mindvl's client reads)
        _count(server.metrics, labels, start, "instance")
        raise Failure(str(results[0]), 400, "instance")
    if failed:
        server.metrics.errors.labels("instance").inc(failed)
    _count(server.metrics, labels, start, "partial" if failed else "ok")
    return results, loaded.version


def _count(metrics: Metrics, labels: Tuple[str, str, str], start: float, outcome: str) -> None:
    answered = outcome in ("ok", "partial")  # anything else is the kind of error that failed the request
    metrics.requests.labels(*labels, outcome if answered else "error").inc()
    if not answered:
        metrics.errors.labels(outcome).inc()
    metrics.latency.labels(*labels).observe(time.perf_counter() - start)


def generative(catalog: Catalog, servable: str, version: int, client: Optional[str] = None) -> LoadedVersion:
    """The loaded version of a servable that generates; NotAvailable when there is none, Failure when the
    servable does not generate."""
    loaded = catalog.get(servable, version, client)
    if loaded.batcher is None:
        raise Failure(f"servable {servable} does not generate (it has {', '.join(sorted(loaded.methods))}); "
                      f"deploy a generative model package to stream answers", 400, "protocol")
    return loaded
