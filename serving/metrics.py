"""`Metrics`: what `GET /metrics` reports (Prometheus text), counted by every route of both protocols.

Label sets stay bounded: a servable or method name becomes a label only once it is known to exist.
"""
from typing import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """Prometheus counters and histograms, in a registry of their own (several servers in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("mindvl_requests", "Predict requests answered", ["servable", "method", "protocol", "outcome"],
                                registry=self.registry)
        self.errors = Counter("mindvl_errors", "Failed requests or instances by kind", ["kind"], registry=self.registry)
        self.instances = Counter("mindvl_instances", "Instances answered", ["servable", "method"], registry=self.registry)
        self.routed = Counter("mindvl_version_requests", "Requests routed to each servable version (a gray release's "
                              "split included)", ["servable", "version"], registry=self.registry)
        self.latency = Histogram("mindvl_request_latency_seconds", "Predict latency, queueing included",
                                 ["servable", "method", "protocol"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("mindvl_batch_size", "Instances per executed graph batch", ["servable", "model"],
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=self.registry)
        self.loaded = Gauge("mindvl_loaded_versions", "Loaded versions per servable", ["servable"], registry=self.registry)
        self.connections = Gauge("mindvl_open_connections", "REST connections open", registry=self.registry)
        self.inflight = Gauge("mindvl_inflight_body_bytes", "REST request bodies held, read to answered",
                              registry=self.registry)

    def watch_generation(self, loaded: Callable[[], Mapping[str, Mapping]]) -> None:
        """Report the generation engines of the versions `loaded()` gives (servable -> version -> LoadedVersion)."""
        self.registry.register(GenerationCounters(loaded))

    def count_loaded(self, loaded: Mapping[str, Mapping]) -> None:
        """Set the loaded-versions gauge from the catalog's `loaded` (servable -> its loaded versions), after
        anything that may have loaded or unloaded one (start, the poller, the admin endpoints)."""
        for name, versions in loaded.items():
            self.loaded.labels(name).set(len(versions))


GENERATION_COUNTERS = {  # a generative version's engine counts (ContinuousBatcher.counts) -> their help
    "decode_steps": "Decode calls of the generation engine",
    "cancelled": "Generations stopped because their caller went away",
    "prefix_cache_hits": "Prompts prefilled from a cached prefix (--prefix-cache-mb)",
    "prefix_cache_misses": "Prompts looked up in the prefix cache and prefilled whole",
    "prefix_reused_tokens": "Prompt tokens whose cache rows came from the prefix cache",
    "speculative_drafted_tokens": "Prompt-lookup draft tokens verified (--speculative-tokens)",
    "speculative_accepted_tokens": "Draft tokens that were the tokens sampled",
}


class GenerationCounters:
    """A collector of every loaded generative version's engine counts, read at each scrape (the engine counts on
    its own thread; a version unloaded takes its counts with it)."""

    def __init__(self, loaded: Callable[[], Mapping[str, Mapping]]) -> None:
        self.loaded = loaded

    def collect(self):
        families = {name: CounterMetricFamily(f"mindvl_generation_{name}", doc, labels=["servable", "version"])
                    for name, doc in GENERATION_COUNTERS.items()}
        for servable, versions in self.loaded().items():
            for version, loaded in versions.items():
                if getattr(loaded, "batcher", None) is not None:
                    for name, value in loaded.batcher.counts().items():
                        families[name].add_metric([servable, str(version)], value)
        yield from families.values()
