"""The server's Prometheus metrics, per model, in a registry of the server's own.

A registry per server (not the process-wide default) lets several servers live in one
process -- tests start many -- without their counters mixing or colliding.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Requests naming no served model are counted under this label, so that a client making up
# names cannot grow the label set without bound.
UNKNOWN_MODEL = "(unknown)"

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                    5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    """Counters and histograms of one server; :meth:`render` is the ``/metrics`` page."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ember_requests", "Inference requests received", ["model"], registry=self.registry)
        self.errors = Counter(
            "ember_request_errors", "Inference requests answered with an error, by kind "
            "(bad_request, not_found, payload_too_large, queue_full, timeout, unavailable, "
            "internal)", ["model", "kind"], registry=self.registry)
        self.latency = Histogram(
            "ember_request_latency_seconds", "Time from a request's arrival to its response",
            ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_delay = Histogram(
            "ember_queue_delay_seconds", "Time a request waited in its model's queue before "
            "its batch started", ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram(
            "ember_batch_size", "Samples per model call", ["model"], buckets=_BATCH_BUCKETS,
            registry=self.registry)
        self.batch_requests = Histogram(
            "ember_batch_requests", "Requests per model call", ["model"],
            buckets=_BATCH_BUCKETS, registry=self.registry)
        self.inference = Histogram(
            "ember_inference_seconds", "Time of one model call (a batch)", ["model"],
            buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge(
            "ember_queue_depth", "Requests waiting in the model's queue", ["model"],
            registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
