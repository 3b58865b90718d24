"""dwsearch.common.tracing in-process: off unless an OTLP endpoint is set, the bounded HTTP
route, SQL statements without their string constants, trace ids in JSON logs, and the
embedder batcher's queue-wait, batch and forward spans."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg import sql

from dwsearch.common import tracing
from dwsearch.common.logging import JsonFormatter
from dwsearch.modelserver.batching import Batcher, Lane


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    deactivate = tracing.activate(provider)
    try:
        yield exporter
    finally:
        deactivate()


def test_off_without_an_endpoint_and_when_disabled():
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"})
    assert not tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}
    )


async def test_off_the_hooks_cost_nothing():
    assert not tracing.ENABLED
    work = asyncio.sleep(0)
    assert tracing.traced("x", work) is work
    await work
    with tracing.span("x", org_id="o") as current:
        assert current is None
    assert tracing.grpc_server_interceptors() == []
    assert tracing.grpc_client_interceptors() == []
    assert tracing.log_ids() is None
    app = object()
    assert tracing.asgi(app, "the REST API") is app


PROCESS_THREADS = """
import json, sys, threading
from dwsearch.common import tracing
on = tracing.configure("serve", sql=True)
threads = sorted(t.name for t in threading.enumerate())
print(json.dumps({"on": on, "threads": threads, "sdk": "opentelemetry.sdk.trace" in sys.modules}))
"""


@pytest.mark.parametrize("endpoint", [None, "http://127.0.0.1:9"])
def test_a_process_starts_no_exporter_thread_unless_an_endpoint_is_set(endpoint):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    done = subprocess.run(
        [sys.executable, "-c", PROCESS_THREADS], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    exporters = [name for name in seen["threads"] if name.startswith("Otel")]
    if endpoint:
        assert seen["on"] and exporters and seen["sdk"]
    else:  # not even the SDK imported
        assert not seen["on"] and not exporters and not seen["sdk"]


def test_no_child_span_is_made_under_a_span_the_sampler_dropped():
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.5)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    deactivate = tracing.activate(provider)
    try:
        kept = dropped = 0
        for _ in range(200):
            with (
                tracing.tracer().start_as_current_span("request") as root,
                tracing.span("stage fuse") as stage,
            ):
                tracing.annotate(mode="hybrid")
                if root.is_recording():
                    kept += 1
                    assert stage is not None and stage.is_recording()
                else:
                    dropped += 1
                    assert stage is None  # nothing made, not even a non-recording span
        assert kept and dropped
        names = [s.name for s in exporter.get_finished_spans()]
        assert names.count("request") == kept and names.count("stage fuse") == kept
    finally:
        deactivate()


def test_http_route_keeps_the_endpoint_never_the_data():
    assert tracing.http_route("/") == "/"
    assert tracing.http_route("/query/customer-namespace") == "/query"
    assert tracing.http_route("/fetch/ns/some-id") == "/fetch"
    assert tracing.http_route("/v1/embeddings") == "/v1/embeddings"
    assert tracing.http_route("/api/search") == "/api/search"
    assert tracing.http_route("/static/app.js") == "/static"
    assert tracing.http_route("/" + "x" * 100) == "/{other}"
    assert tracing.http_route("/query text with spaces") == "/{other}"
    rest = {"support", "query-data", "fetch"}  # the REST API's index names and endpoints
    assert tracing.http_route("/support/query-data/customer-namespace", rest) == "/support/query-data"
    assert tracing.http_route("/fetch/customer-namespace", rest) == "/fetch"
    assert tracing.http_route("/unknown-index/fetch", rest) == "/{other}"


def test_statement_text_replaces_string_constants():
    composed = sql.SQL("SELECT plainto_tsquery('simple', {}) || {}").format(
        sql.Literal("secret-word"), sql.Literal("it's back\\slash")
    )
    text = tracing.statement_text(composed.as_string(None))
    assert "secret" not in text and "back" not in text and "slash" not in text
    assert text.startswith("SELECT plainto_tsquery(?, ?) || ")
    assert tracing.statement_text("SELECT $$planted$$, $tag$x$tag$, %s, $1, 40") == "SELECT ?, ?, %s, $1, 40"
    assert tracing.statement_text("SELECT 'unterminated planted") == "SELECT ?"


def test_json_logs_carry_the_trace_and_span_ids(exported: InMemorySpanExporter):
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "hello", (), None)
    assert "trace_id" not in json.loads(JsonFormatter().format(record))
    with tracing.span("work") as current:
        assert current is not None
        line = json.loads(JsonFormatter().format(record))
        context = current.get_span_context()
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")


def test_attributes_are_namespaced_and_bounded_types(exported: InMemorySpanExporter):
    with tracing.span("s", org_id="org-1", hits=3, skip=None, reason=Lane.BULK):
        tracing.annotate(mode="hybrid")
    (span,) = exported.get_finished_spans()
    assert dict(span.attributes or {}) == {
        "dwsearch.org_id": "org-1",
        "dwsearch.hits": 3,
        "dwsearch.reason": "Lane.BULK",
        "dwsearch.mode": "hybrid",
    }


async def test_a_batch_is_linked_to_every_request_it_carried(exported: InMemorySpanExporter):
    batcher: Batcher[str, int] = Batcher(
        "embedder",
        lambda items: [len(i) for i in items],
        max_batch_tokens=1000,
        max_batch_inputs=64,
        max_queue=100,
        prior_overhead_tokens=0.0,
        model="m",
    )
    batcher.start()
    try:
        started = asyncio.Event()

        async def call(name: str, texts: list[str]) -> list[int]:
            with tracing.span(name):
                started.set()
                return await batcher.submit(texts, [len(t) for t in texts], lane=Lane.BULK)

        first, second = await asyncio.gather(call("one", ["aa", "b"]), call("two", ["ccc"]))
    finally:
        await batcher.close()
    assert first == [2, 1] and second == [3]
    spans = exported.get_finished_spans()
    calls = {s.name: s for s in spans if s.name in ("one", "two")}
    waits = [s for s in spans if s.name == "embedder queue wait"]
    batches = [s for s in spans if s.name == "embedder batch"]
    forwards = [s for s in spans if s.name == "embedder forward"]
    assert {w.parent.span_id for w in waits if w.parent} == {c.context.span_id for c in calls.values()}
    linked = {link.context.span_id for b in batches for link in b.links}
    assert linked == {c.context.span_id for c in calls.values()}
    assert all(b.parent is not None for b in batches)  # under a request's call: in its trace
    assert {f.parent.span_id for f in forwards if f.parent} == {b.context.span_id for b in batches}
    for s in waits + batches + forwards:
        assert s.attributes is not None and s.attributes["dwsearch.model"] == "m"


# --- gRPC: a real aio server and channel over a socket, with the interceptors ---------

ECHO = "dwsearch.test.Echo"


class EchoServer:
    """A gRPC aio server of three methods (Say echoes, Fail aborts INVALID_ARGUMENT, Count
    streams), recording the traceparent each call carried and the context it was given."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []
        self.contexts: list[object] = []
        self.address = ""

    def _saw(self, context: grpc.aio.ServicerContext) -> None:
        self.traceparents.append(dict(context.invocation_metadata() or ()).get("traceparent"))
        self.contexts.append(context)

    async def say(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._saw(context)
        return request

    async def fail(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._saw(context)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no such thing")
        raise AssertionError("abort returned")

    async def count(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self._saw(context)
        for i in range(3):
            yield str(i).encode()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[grpc.aio.Channel]:
        handler = grpc.method_handlers_generic_handler(
            ECHO,
            {
                "Say": grpc.unary_unary_rpc_method_handler(self.say),
                "Fail": grpc.unary_unary_rpc_method_handler(self.fail),
                "Count": grpc.unary_stream_rpc_method_handler(self.count),
            },
        )
        server = grpc.aio.server(interceptors=tracing.grpc_server_interceptors())
        server.add_generic_rpc_handlers([handler])
        self.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        try:
            async with grpc.aio.insecure_channel(
                self.address, interceptors=tracing.grpc_client_interceptors()
            ) as channel:
                yield channel
        finally:
            await server.stop(None)


async def three_calls(channel: grpc.aio.Channel) -> None:
    assert await channel.unary_unary(f"/{ECHO}/Say")(b"hi", timeout=10) == b"hi"
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await channel.unary_unary(f"/{ECHO}/Fail")(b"x", timeout=10)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failed.value.details() == "no such thing"
    assert [r async for r in channel.unary_stream(f"/{ECHO}/Count")(b"", timeout=10)] == [b"0", b"1", b"2"]


def parsed(traceparent: str | None) -> tuple[int, int, bool]:
    """A traceparent's trace id, parent span id and sampled flag."""
    assert traceparent is not None
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return int(trace_id, 16), int(span_id, 16), bool(int(flags, 16) & 1)


def provider_of(sampler: object) -> tuple[InMemorySpanExporter, Callable[[], None]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, tracing.activate(provider)


async def test_rpcs_under_a_sampled_trace_have_client_and_server_spans_with_their_status():
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON
    from opentelemetry.trace import SpanKind, StatusCode

    exporter, deactivate = provider_of(ALWAYS_ON)
    echo = EchoServer()
    try:
        async with echo.serving() as channel:
            with tracing.tracer().start_as_current_span("caller") as caller:
                await three_calls(channel)
                trace_id = caller.get_span_context().trace_id
    finally:
        deactivate()
    assert [parsed(tp)[::2] for tp in echo.traceparents] == [(trace_id, True)] * 3
    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {trace_id}
    clients = {s.name: s for s in spans if s.kind == SpanKind.CLIENT}
    servers = {s.name: s for s in spans if s.kind == SpanKind.SERVER}
    assert set(clients) == set(servers) == {f"/{ECHO}/{m}" for m in ("Say", "Fail", "Count")}
    for name, server in servers.items():
        assert server.parent is not None and server.parent.span_id == clients[name].context.span_id
        attributes = dict(server.attributes or {})
        assert attributes["rpc.system"] == "grpc" and attributes["rpc.service"] == ECHO
        assert attributes["rpc.method"] == name.rsplit("/", 1)[1]
        assert attributes["net.peer.ip"] == "127.0.0.1"
    failed = servers[f"/{ECHO}/Fail"]
    assert failed.attributes is not None and failed.attributes["rpc.grpc.status_code"] == 3
    assert failed.status.status_code == StatusCode.ERROR and failed.status.description
    assert clients[f"/{ECHO}/Fail"].status.status_code == StatusCode.ERROR
    assert servers[f"/{ECHO}/Say"].status.status_code == StatusCode.UNSET


async def test_an_rpc_under_a_dropped_span_carries_the_trace_and_makes_no_span():
    """At 1% sampling, 99 calls of 100: the client makes no span and sends the trace's
    traceparent with its sampled flag off; the server's span is not recording, gets no
    attributes, and its handler is given grpc's own context. Status and streams are
    untouched."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    exporter, deactivate = provider_of(ParentBased(ALWAYS_OFF))
    echo = EchoServer()
    try:
        async with echo.serving() as channel:
            with tracing.tracer().start_as_current_span("caller") as caller:
                assert not caller.is_recording()
                await three_calls(channel)
                context = caller.get_span_context()
    finally:
        deactivate()
    assert [parsed(tp) for tp in echo.traceparents] == [(context.trace_id, context.span_id, False)] * 3
    assert all(type(c).__module__.startswith("grpc") for c in echo.contexts)  # no proxy
    assert exporter.get_finished_spans() == ()


async def test_an_rpc_without_a_caller_trace_is_sampled_at_the_server():
    """A call with no traceparent starts its trace at the server: the sampler decides, and
    the spans it keeps carry the library's attributes."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    exporter, deactivate = provider_of(ParentBased(TraceIdRatioBased(0.5)))
    echo = EchoServer()
    try:
        async with echo.serving(), grpc.aio.insecure_channel(echo.address) as bare:
            for _ in range(40):
                assert await bare.unary_unary(f"/{ECHO}/Say")(b"hi", timeout=10) == b"hi"
    finally:
        deactivate()
    assert echo.traceparents == [None] * 40
    kept = exporter.get_finished_spans()
    assert 0 < len(kept) < 40
    assert all((s.attributes or {}).get("rpc.method") == "Say" and s.parent is None for s in kept)
