"""OpenTelemetry tracing of every dwsearch process (serve, embedder, reranker and the
`sweep` / `purge` commands): off unless the standard OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, exported over OTLP gRPC by the SDK's own
exporter, which reads the other standard OTEL_* variables itself (headers, certificate,
timeout, compression); the SDK reads OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES. OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none keep it off.

`configure(process)` is called once at a process's start. Off, nothing of the SDK is
imported, no exporter thread runs, and each hook here costs one test of `ENABLED`.

What is traced: every RPC (opentelemetry-instrumentation-grpc's server and client
interceptors: the W3C `traceparent` comes in from the call's metadata and goes out on
every call to the embedder and reranker), every HTTP request on the REST, console and
model-server HTTP ports (`asgi`: `traceparent` from the headers), every SQL statement
(opentelemetry-instrumentation-psycopg, with `db.statement` the statement's text with
its string literals replaced: never a parameter, never a literal value), and the spans
the code opens with `span` / `traced` (search stages, the embedder's queue wait, batch
and forward pass, sweep keys and batches). Attributes are bounded and carry no text of a
chat, query or document and no id of a message: org id, mode, model, counts, degradation
reasons, status.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanContext, Tracer

log = logging.getLogger(__name__)

T = TypeVar("T")

ENABLED = False
"""Whether this process traces (configure found an endpoint). Read on every hook."""

_tracer: Tracer | None = None

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

# Spans of these gRPC services are never made: the kubelet's health probes and
# reflection would fill a trace store with nothing.
UNTRACED_SERVICES = ("grpc.health.v1.", "grpc.reflection.")

ATTRIBUTE_PREFIX = "dwsearch."


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for tracing: an OTLP endpoint set, the SDK not disabled
    and the traces exporter not `none`."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def configure(process: str, *, sql: bool = False) -> bool:
    """Tracing for this process (`process`: "serve", "embedder", "reranker", "sweep", …),
    when the environment asks for it (`wanted`): the SDK's tracer provider with a batch
    processor over the OTLP gRPC exporter, service.name `dwsearch-<process>` unless
    OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) names it, and, with
    `sql`, psycopg's statements traced. Returns whether tracing is on."""
    if ENABLED or not wanted():
        return ENABLED
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    activate(_provider(process, OTLPSpanExporter()), sql=sql)
    log.info("tracing on", extra={"component": process, "exporter": "otlp-grpc"})
    return True


def _provider(process: str, exporter: SpanExporter) -> TracerProvider:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = os.environ.get("OTEL_SERVICE_NAME", "").strip() or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {SERVICE_NAME: f"dwsearch-{process}"})
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def activate(provider: TracerProvider, *, sql: bool = False) -> Callable[[], None]:
    """Trace into `provider` from now on (configure's, or a test's own provider); returns
    what turns tracing off again (a test's cleanup; the SQL instrumentation stays)."""
    global ENABLED, _tracer
    from opentelemetry import trace

    with contextlib.suppress(Exception):  # the global provider can be set once per process
        trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("dwsearch")
    ENABLED = True
    if sql:
        instrument_sql(provider)

    def deactivate() -> None:
        global ENABLED, _tracer
        ENABLED, _tracer = False, None

    return deactivate


def tracer() -> Tracer:
    assert _tracer is not None, "tracing is off"
    return _tracer


# --- spans the code opens -------------------------------------------------------------


def attributes(values: Mapping[str, object]) -> dict[str, Any]:
    """`values` as span attributes: each name under `dwsearch.`, None left out, booleans,
    numbers and strings kept, anything else as its str()."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        name = key if "." in key else ATTRIBUTE_PREFIX + key
        out[name] = value if isinstance(value, bool | int | float | str) else str(value)
    return out


@contextlib.contextmanager
def _span(name: str, values: Mapping[str, object]) -> Iterator[Span]:
    with tracer().start_as_current_span(name, attributes=attributes(values)) as current:
        yield current


def _unsampled() -> bool:
    """Whether the current span is one the sampler dropped: a valid context that records
    nothing. Its children would be dropped too (the parent-based samplers follow the
    parent; the trace-id ratio decides the same for every span of a trace), so no child
    span is made at all: at 1% sampling, 99 requests of 100 skip the SDK's work for each
    stage and statement."""
    from opentelemetry import trace

    current = trace.get_current_span()
    return current.get_span_context().is_valid and not current.is_recording()


def span(name: str, **values: object) -> contextlib.AbstractContextManager[Span | None]:
    """A span `name` around the block, child of the current one, with `values` as its
    attributes (see `attributes`); a no-op yielding None when tracing is off or the
    current span was not sampled."""
    if not ENABLED or _unsampled():
        return contextlib.nullcontext()
    return _span(name, values)


def traced(name: str, work: Awaitable[T], **values: object) -> Awaitable[T]:
    """`work` inside a span `name` (see `span`); `work` itself when tracing is off or the
    current span was not sampled."""
    if not ENABLED or _unsampled():
        return work
    return _traced(name, work, values)


async def _traced(name: str, work: Awaitable[T], values: Mapping[str, object]) -> T:
    with _span(name, values):
        return await work


def annotate(**values: object) -> None:
    """Attributes added to the current span (see `attributes`), when tracing."""
    if not ENABLED:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(attributes(values))


def current_context() -> SpanContext | None:
    """The current span's context (a request handed to another thread keeps it to link
    or parent its spans there); None when tracing is off or no span is current."""
    if not ENABLED:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


def current_trace_id() -> str:
    """The current trace's id (32 hex digits), "" when none."""
    context = current_context()
    return "" if context is None else format(context.trace_id, "032x")


def log_ids() -> dict[str, str] | None:
    """trace_id and span_id of the current span, for a log record; None when none."""
    context = current_context()
    if context is None:
        return None
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


def record_span(
    name: str,
    *,
    start_ns: int,
    end_ns: int,
    parent: SpanContext | None = None,
    links: Sequence[SpanContext] = (),
    **values: object,
) -> SpanContext | None:
    """A span already over (from `start_ns` to `end_ns`, time.time_ns()), child of
    `parent` (None: a root) and linked to `links`: what a worker thread records for work it
    did for requests of other contexts. Returns its context, for spans under it."""
    if not ENABLED:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import Link

    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent is not None else None
    done = tracer().start_span(
        name,
        context=context,
        links=[Link(link) for link in links],
        attributes=attributes(values),
        start_time=start_ns,
    )
    done.end(end_time=end_ns)
    recorded = done.get_span_context()
    return recorded if recorded.is_valid else None


# --- gRPC -------------------------------------------------------------------------------


def _traced_method(method: str | bytes | None) -> bool:
    if isinstance(method, bytes):
        method = method.decode("ascii", "replace")
    return not (method or "").lstrip("/").startswith(UNTRACED_SERVICES)


def grpc_server_interceptors() -> list[Any]:
    """The server interceptor (a span per RPC, the caller's traceparent from its metadata;
    see `_grpc_server_interceptor`), health and reflection left out; [] when off."""
    if not ENABLED:
        return []
    interceptor = _grpc_server_interceptor()
    return [interceptor(tracer(), filter_=lambda details: _traced_method(details.method))]


def grpc_client_interceptors() -> list[Any]:
    """The client interceptors (a span per call, the trace's traceparent in its metadata;
    see `_grpc_client_interceptors`), health left out; [] when off."""
    if not ENABLED:
        return []
    return [
        interceptor(tracer(), filter_=lambda details: _traced_method(details.method))
        for interceptor in _grpc_client_interceptors()
    ]


def _grpc_server_interceptor() -> type:
    """opentelemetry-instrumentation-grpc's aio server interceptor, made cheap for a span the
    sampler drops: the span is started bare and gets the library's attributes (rpc.*,
    net.peer.*) only when it records, and the servicer context is wrapped (to see the
    status code an abort or set_code gives) only then. At 1% sampling, 99 calls of 100
    pay for a span id and the sampler, not for the attribute dict, the peer's parsing and
    a proxy in front of every context call (bench.tracing)."""
    from opentelemetry import trace
    from opentelemetry.instrumentation.grpc._aio_server import (
        OpenTelemetryAioServerInterceptor,
        _OpenTelemetryAioServicerContext,
    )
    from opentelemetry.instrumentation.grpc._server import OpenTelemetryServerInterceptor

    class _Attributes:
        """A stand-in tracer: the library's _start_span hands it the attributes it built."""

        @staticmethod
        def start_as_current_span(*, attributes: dict[str, Any], **_: Any) -> dict[str, Any]:
            return attributes

    library = OpenTelemetryServerInterceptor(_Attributes())

    def recorded(error: BaseException) -> bool:
        # A bare Exception is how grpc.aio carries an abort, which the context records.
        return type(error) is not Exception

    class ServerInterceptor(OpenTelemetryAioServerInterceptor):
        @contextlib.contextmanager
        def _rpc_span(self, details: Any, context: Any) -> Iterator[Any]:
            with self._set_remote_context(context):
                current = self._tracer.start_span(details.method, kind=trace.SpanKind.SERVER)
                if current.is_recording():
                    current.set_attributes(library._start_span(details, context))
                with trace.use_span(current, end_on_exit=True, record_exception=False):
                    yield current

        def _intercept_aio_server_unary(self, behavior: Any, details: Any) -> Any:
            async def unary(request: Any, context: Any) -> Any:
                with self._rpc_span(details, context) as current:
                    if not current.is_recording():
                        return await behavior(request, context)
                    try:
                        return await behavior(request, _OpenTelemetryAioServicerContext(context, current))
                    except BaseException as error:
                        if recorded(error):
                            current.record_exception(error)
                        raise

            return unary

        def _intercept_aio_server_stream(self, behavior: Any, details: Any) -> Any:
            async def stream(request: Any, context: Any) -> Any:
                with self._rpc_span(details, context) as current:
                    if current.is_recording():
                        context = _OpenTelemetryAioServicerContext(context, current)
                    try:
                        async for response in behavior(request, context):
                            yield response
                    except BaseException as error:
                        if current.is_recording() and recorded(error):
                            current.record_exception(error)
                        raise

            return stream

    return ServerInterceptor


def _grpc_client_interceptors() -> list[type]:
    """opentelemetry-instrumentation-grpc's four aio client interceptors, each skipping the
    span of a call made under a span the sampler dropped (see _unsampled): that call only
    carries the trace's traceparent (its sampled flag off, so the server drops its span
    too) and is otherwise the bare call, not one the library waits on for its status."""
    from opentelemetry.instrumentation.grpc import _aio_client

    library: Any = _aio_client  # untyped

    class UnaryUnary(library.UnaryUnaryAioClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            if _unsampled() and not self.tracing_skipped(details):
                return await continuation(self.propagate_trace_in_details(details), request)
            return await super().intercept_unary_unary(continuation, details, request)

    class UnaryStream(library.UnaryStreamAioClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            if _unsampled() and not self.tracing_skipped(details):
                return await continuation(self.propagate_trace_in_details(details), request)
            return await super().intercept_unary_stream(continuation, details, request)

    class StreamUnary(library.StreamUnaryAioClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
            if _unsampled() and not self.tracing_skipped(details):
                return await continuation(self.propagate_trace_in_details(details), requests)
            return await super().intercept_stream_unary(continuation, details, requests)

    class StreamStream(library.StreamStreamAioClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
            if _unsampled() and not self.tracing_skipped(details):
                return await continuation(self.propagate_trace_in_details(details), requests)
            return await super().intercept_stream_stream(continuation, details, requests)

    return [UnaryUnary, UnaryStream, StreamUnary, StreamStream]


# --- HTTP -------------------------------------------------------------------------------

_SEGMENT = re.compile(r"[A-Za-z0-9_.-]{1,40}")
# A first path segment after which the second names the endpoint too (/v1/embeddings,
# /api/search); after any other, the second is data (a REST namespace) and is left out.
_PREFIXES = frozenset({"api", "v1", "v2", "static"})


def http_route(path: str, known: Collection[str] = ()) -> str:
    """A request path reduced to the endpoint it names, bounded. With `known` (the REST
    API's index names and endpoints): its leading segments found there, at most two, else
    `{other}`: a REST namespace or id is never kept. Without: its first segment (and the
    second after /api, /v1, /v2), each a short word, else `{other}`."""
    parts = path.strip("/").split("/")
    if not parts[0]:
        return "/"
    if known:
        kept = list(itertools.takewhile(lambda p: p in known, parts[:2]))
        return "/" + "/".join(kept) if kept else "/{other}"
    kept = parts[:2] if parts[0] in _PREFIXES and len(parts) > 1 else parts[:1]
    if parts[0] == "static":
        kept = kept[:1]
    return "/" + "/".join(p if _SEGMENT.fullmatch(p) else "{other}" for p in kept)


def asgi(app: Any, server: str, routes: Collection[str] = ()) -> Any:
    """`app` with a SERVER span per HTTP request (the caller's traceparent honoured), named
    by method and route (`http_route` over `routes`), with its status; `app` itself when
    tracing is off."""
    if not ENABLED:
        return app
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind, Status, StatusCode

    async def traced_app(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return
        carrier = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in scope.get("headers", ())
            if key in (b"traceparent", b"tracestate")
        }
        method = str(scope.get("method", "GET"))
        route = http_route(str(scope.get("path", "/")), routes)
        with tracer().start_as_current_span(
            f"{method} {route}",
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": route, "dwsearch.server": server},
        ) as current:

            async def traced_send(message: Any) -> None:
                if message.get("type") == "http.response.start":
                    status = int(message.get("status", 0))
                    current.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        current.set_status(Status(StatusCode.ERROR))
                await send(message)

            await app(scope, receive, traced_send)

    return traced_app


# --- SQL --------------------------------------------------------------------------------

# A string constant: '…' ('' inside), E'…' (backslash escapes), or $tag$…$tag$.
_STRING = re.compile(
    r"(?:\b[EeNnBbXxUu]&?)?'(?:[^'\\]|''|\\.)*'|\$([A-Za-z_][A-Za-z0-9_]*|)\$.*?\$\1\$", re.S
)


def statement_text(statement: str) -> str:
    """A SQL statement as a span may show it: each string constant (a value psycopg's
    sql.Literal inlined, say a query's word) replaced by `?`; a quote left unmatched cuts
    the rest. Placeholders and numbers stay: parameters are never in the text."""
    scrubbed = _STRING.sub("?", statement)
    quote = scrubbed.find("'")
    return scrubbed if quote < 0 else scrubbed[:quote] + "?"


def instrument_sql(provider: TracerProvider | None = None) -> None:
    """psycopg's statements traced by opentelemetry-instrumentation-psycopg: parameters
    never captured (capture_parameters=False, its default, said), no sqlcommenter, and
    `db.statement` the statement with its string constants replaced (statement_text)."""
    import opentelemetry.instrumentation.psycopg as otel_psycopg

    class ScrubbedCursorTracer(otel_psycopg.CursorTracer):
        def get_statement(self, cursor: Any, args: Any) -> str:
            return statement_text(super().get_statement(cursor, args))

        # Under a span the sampler dropped, a statement runs as if not instrumented (see
        # _unsampled): no statement text rendered, no span, no metric.
        def traced_execution(self, cursor: Any, query_method: Any, *args: Any, **kwargs: Any) -> Any:
            if _unsampled():
                return query_method(*args, **kwargs)
            return super().traced_execution(cursor, query_method, *args, **kwargs)

        async def traced_execution_async(
            self, cursor: Any, query_method: Any, *args: Any, **kwargs: Any
        ) -> Any:
            if _unsampled():
                return await query_method(*args, **kwargs)
            return await super().traced_execution_async(cursor, query_method, *args, **kwargs)

    # The instrumentation makes each connection's cursor tracer from this name.
    otel_psycopg.CursorTracer = ScrubbedCursorTracer  # type: ignore[misc]
    instrumentor = otel_psycopg.PsycopgInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(
            tracer_provider=provider, capture_parameters=False, enable_commenter=False, skip_dep_check=True
        )
