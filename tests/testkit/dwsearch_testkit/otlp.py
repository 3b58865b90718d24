"""An OTLP/gRPC trace receiver for tests: opentelemetry-proto's own TraceService on
127.0.0.1, collecting every span the processes export (dwsearch.common.tracing), flattened
to what a test asserts on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2


def _value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    status_message: str = ""

    def strings(self) -> Iterator[str]:
        """Every string the span carries (names, attribute values, events, status)."""
        yield self.service
        yield self.name
        yield self.status_message
        for key, value in self.attributes.items():
            yield key
            yield str(value)
        for name, attrs in self.events:
            yield name
            for key, value in attrs.items():
                yield key
                yield str(value)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any) -> Any:
        spans = []
        for resource_spans in request.resource_spans:
            attrs = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            service=service,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={kv.key: _value(kv.value) for kv in s.attributes},
                            events=[
                                (e.name, {kv.key: _value(kv.value) for kv in e.attributes}) for e in s.events
                            ],
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            status_message=s.status.message,
                        )
                    )
        with self.receiver.lock:
            self.receiver.spans.extend(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """A TraceService on 127.0.0.1:<free port>; `env()` points a process at it."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def __enter__(self) -> OtlpReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(0)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The standard OTEL_* variables of a process exporting here, every trace sampled
        and the batch processor flushing every 100 ms."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            **extra,
        }

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def wait_for(
        self, condition: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """The spans received once `condition` holds of them; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.received()
            if condition(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in spans})
                raise AssertionError(f"spans never matched; received {len(spans)}: {names}")
            time.sleep(0.1)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.received() if s.trace_id == trace_id]
