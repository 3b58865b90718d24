"""dwsearch.common.tracing in-process: off unless an OTLP endpoint is set, the bounded HTTP
route, SQL statements without their string constants, trace ids in JSON logs, and the
embedder batcher's queue-wait, batch and forward spans."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator

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
