"""`Metrics`: what `GET /metrics` reports (Prometheus text), counted by every route of both protocols.

Label sets stay bounded: a servable or method name becomes a label only once it is known to exist.
"""
from typing import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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

    def count_loaded(self, loaded: Mapping[str, Mapping]) -> None:
        """Set the loaded-versions gauge from the catalog's `loaded` (servable -> its loaded versions), after
        anything that may have loaded or unloaded one (start, the poller, the admin endpoints)."""
        for name, versions in loaded.items():
            self.loaded.labels(name).set(len(versions))
