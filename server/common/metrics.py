"""Prometheus metrics shared by the three processes, served on their own port."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

RPC_REQUESTS = Counter(
    "dwsearch_grpc_requests_total", "RPCs handled, by final status code", ["service", "method", "code"]
)
RPC_SECONDS = Histogram(
    "dwsearch_grpc_request_seconds",
    "RPC handling time",
    ["service", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)


def observe_rpc(service: str, method: str, code: str, seconds: float) -> None:
    RPC_REQUESTS.labels(service, method, code).inc()
    RPC_SECONDS.labels(service, method).observe(seconds)


def serve_metrics(port: int) -> None:
    """Expose /metrics on `port` (0 = off)."""
    if port:
        start_http_server(port)
