"""The Upstash-Vector-compatible REST API as an ASGI (Starlette) app: transport only.

Every call is a POST of JSON to `/{endpoint}[/{namespace}]` (the index is the bearer
token's) or `/{index}/{endpoint}[/{namespace}]`, answered `{"result": …}` or
`{"error": …}`. Here are the bearer tokens, the routing through ENDPOINTS (a table of
endpoint → handler), the body limits, JSON in and out, and the error statuses; each
endpoint's Upstash semantics are dwsearch.rest.upstash's, over the index's DocumentIndex."""

from __future__ import annotations

import functools
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from dwsearch.common import offload
from dwsearch.common.errors import (
    INTERNAL_MESSAGE,
    DwsearchError,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    classify,
)
from dwsearch.common.httpbody import BodyTooLarge, read_capped
from dwsearch.common.httpstatus import http_status
from dwsearch.rest import jsonbody
from dwsearch.rest.encode import dumps
from dwsearch.rest.upstash import (
    NAMESPACE_SEPARATOR,
    RestIndex,
    RestIndexes,
    collect_degradations,
    degraded_header,
)

__all__ = ["NAMESPACE_SEPARATOR", "RestApi", "RestIndex"]

log = logging.getLogger(__name__)

REST_REQUESTS = Counter(
    "dwsearch_rest_requests_total",
    "REST API (Upstash-compatible) calls, by index, endpoint and HTTP status",
    ["index", "endpoint", "status"],
)
REST_SECONDS = Histogram(
    "dwsearch_rest_request_seconds",
    "REST API call handling time",
    ["endpoint"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
SMALL_BODY_BYTES = 1024 * 1024
"""Every endpoint but upsert: ids, a query, a filter, one document's update."""
RESULT_ITEM_COST = 256
"""What serializing one result costs, in characters (offload.INLINE_MAX_SIZE's unit)."""
JSON_INLINE_BYTES = 64 * 1024
"""A larger body is parsed, and a larger result serialized, in the CPU pool."""


CLIENT_CLOSED = 499
"""The status a request whose client went away mid-body is counted with (never sent)."""

CONTAINERS_FREE = 65_536
"""JSON objects and arrays any body may hold (a few MiB of Python objects at most)."""
BYTES_PER_CONTAINER = 12
"""Beyond CONTAINERS_FREE, a body holds at most one object or array per this many bytes:
each costs the parser 56-72 bytes of Python objects, so a body of `{},{},…` would cost 26
times its size (a 32 MiB one: 839 MiB) and is refused unparsed; at this bound the parsed
body costs at most about 6 times its size, as a body of numbers does (8 times; an upsert's
vectors, parsed as arrays by dwsearch.rest.jsonbody, 1.6 times)."""


def check_containers(raw: bytes) -> None:
    """Refuses, before parsing, a body of more objects and arrays than its size warrants
    (counting `{` and `[` in strings too, which only errs towards the limit)."""
    containers = raw.count(b"{") + raw.count(b"[")
    allowed = max(CONTAINERS_FREE, len(raw) // BYTES_PER_CONTAINER)
    if containers > allowed:
        raise InvalidArgument(
            f"the request body: {containers} JSON objects and arrays in {len(raw)} bytes; at most {allowed}"
        )


class RestApi:
    """The REST API's HTTP side: bearer tokens, routing, bodies and answers, over the
    indexes serve's composition root built (dwsearch.rest.upstash.build_rest_indexes)."""

    def __init__(self, indexes: RestIndexes, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.indexes = indexes.by_name
        # One budget for the bytes every index's open resumable queries keep (resumable).
        self.resumable_budget = indexes.resumable_budget
        self.tokens = [
            (token.encode(), index) for index in self.indexes.values() for token in index.config.tokens
        ]
        self.max_body_bytes = max_body_bytes

    async def prepare(self) -> None:
        """Before the first request: each float32 index's rows from before it kept float32
        carried over (migration 0006), so none is left out of its searches."""
        for name, index in self.indexes.items():
            carried = await index.domain.carry_over_float32(index.stored(""))
            if carried:
                log.info("REST index rows carried over to float32", extra={"index": name, "rows": carried})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])])

    def _route(self, request: Request) -> tuple[RestIndex, str, str]:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        given = token.strip().encode()
        index = None
        if scheme.lower() == "bearer":
            for candidate, owner in self.tokens:  # each compared in constant time
                if hmac.compare_digest(given, candidate):
                    index = owner
        if index is None:
            raise Unauthenticated("Unauthorized: Invalid auth token")
        segments = request.path_params["path"].split("/", 1)
        head = segments[0]
        if head in self.indexes and head not in ENDPOINTS:
            if self.indexes[head] is not index:
                # Answered as a path naming no index: a token of one index never learns
                # which other index names exist.
                raise NotFound(f"Not found: /{request.path_params['path']}")
            segments = segments[1].split("/", 1) if len(segments) > 1 else [""]
        endpoint = segments[0]
        namespace = segments[1] if len(segments) > 1 else ""
        if endpoint not in ENDPOINTS:
            raise NotFound(f"Not found: /{request.path_params['path']}")
        return index, endpoint, namespace

    async def _body(self, request: Request, limit: int, *, vectors: str = "") -> Any:
        """The body's JSON; `vectors`: each document's field of that name as a float64 array
        (dwsearch.rest.jsonbody), an upsert's, the raw bytes freed once decoded."""
        raw = await read_capped(request, limit)
        if not raw.strip():
            return None
        check_containers(raw)
        size = len(raw)
        try:
            if size <= JSON_INLINE_BYTES:
                return jsonbody.loads(jsonbody.decode(raw), vectors=vectors)
            text = await offload.run(jsonbody.decode, raw, size=size)
            del raw  # the text holds the body now: the bytes go before it is parsed
            return await offload.run(functools.partial(jsonbody.loads, vectors=vectors), text, size=size)
        except (ValueError, RecursionError):
            raise InvalidArgument("the request body: not JSON") from None

    async def handle(self, request: Request) -> Response:
        started = time.perf_counter()
        labels = {"index": "", "endpoint": "unknown"}  # bounded: configured names and ENDPOINTS only
        response = await self._handle(request, labels)
        REST_REQUESTS.labels(labels["index"], labels["endpoint"], str(response.status_code)).inc()
        REST_SECONDS.labels(labels["endpoint"]).observe(time.perf_counter() - started)
        return response

    async def _handle(self, request: Request, labels: dict[str, str]) -> Response:
        degradations = collect_degradations()  # a query's, said in DEGRADED_HEADER
        try:
            index, endpoint, namespace = self._route(request)
            labels.update(index=index.config.name, endpoint=endpoint)
            if request.method != "POST" and endpoint not in READ_ONLY_ENDPOINTS:
                return await _json(405, {"error": f"/{endpoint} writes: POST only"})
            limit = self.max_body_bytes if endpoint in LARGE_BODY_ENDPOINTS else SMALL_BODY_BYTES
            body = await self._body(request, limit, vectors="vector" if endpoint == "upsert" else "")
            result = await ENDPOINTS[endpoint](index, namespace, body, request)
            # Many documents (vectors above all) are serialized in the CPU pool.
            items = result.get("vectors") if isinstance(result, dict) else result  # a range's page
            size = len(items) * RESULT_ITEM_COST if isinstance(items, list) else 0
            return await _json(200, {"result": result}, size=size, headers=degraded_header(degradations))
        except BodyTooLarge as e:  # 413, not RESOURCE_EXHAUSTED's 429
            return await _json(413, {"error": str(e)})
        except ClientDisconnect:  # gone mid-body (or closed at the body deadline): no one to answer
            return Response(status_code=CLIENT_CLOSED)
        except Exception as e:
            # The one classification the gRPC interceptor answers with too (errors.classify),
            # its kind as every HTTP port's table has it (httpstatus).
            classified = classify(e)
            status = http_status(classified.kind)
            if classified.internal:
                if isinstance(e, DwsearchError):
                    log.error("REST call failed", extra={"component": "rest", "error": type(e).__name__})
                else:
                    log.exception("REST call failed", extra={"component": "rest"})
                return await _json(status, {"error": INTERNAL_MESSAGE})
            return await _json(status, {"error": classified.message})


def _no_data(body: Any) -> None:
    for query in body if isinstance(body, list) else [body]:
        if isinstance(query, dict) and query.get("data") is not None:
            raise InvalidArgument("a query by data goes to /query-data")


async def _query(index: RestIndex, namespace: str, body: Any, request: Request) -> Any:
    _no_data(body)
    return await index.query(namespace, body)


async def _query_data(index: RestIndex, namespace: str, body: Any, request: Request) -> Any:
    index.require_model()
    return await index.query(namespace, body)


async def _resumable_query(index: RestIndex, namespace: str, body: Any, request: Request) -> Any:
    _no_data(body)
    return await index.resumable_query(namespace, body)


async def _resumable_query_data(index: RestIndex, namespace: str, body: Any, request: Request) -> Any:
    index.require_model()
    return await index.resumable_query(namespace, body)


Handler = Callable[[RestIndex, str, Any, Request], Awaitable[Any]]

ENDPOINTS: dict[str, Handler] = {
    "upsert": lambda index, namespace, body, request: index.upsert(namespace, body),
    "upsert-data": lambda index, namespace, body, request: index.upsert_data(namespace, body),
    "query": _query,
    "query-data": _query_data,
    "fetch": lambda index, namespace, body, request: index.fetch(namespace, body),
    "range": lambda index, namespace, body, request: index.range(namespace, body),
    "delete": lambda index, namespace, body, request: index.delete(namespace, body),
    "update": lambda index, namespace, body, request: index.update(namespace, body),
    "reset": lambda index, namespace, body, request: index.reset(
        namespace, everything="all" in request.query_params
    ),
    "info": lambda index, namespace, body, request: index.info(),
    "list-namespaces": lambda index, namespace, body, request: index.list_namespaces(),
    "delete-namespace": lambda index, namespace, body, request: index.delete_namespace(namespace),
    "resumable-query": _resumable_query,
    "resumable-query-data": _resumable_query_data,
    "resumable-query-next": lambda index, namespace, body, request: index.resumable_next(body),
    "resumable-query-end": lambda index, namespace, body, request: index.resumable_end(body),
}
"""Each endpoint's handler. Writes and batch queries may be large (LARGE_BODY_ENDPOINTS);
everything else is ids, one query, a filter."""
LARGE_BODY_ENDPOINTS = frozenset({"upsert", "upsert-data", "query", "query-data"})
READ_ONLY_ENDPOINTS = frozenset({"info", "list-namespaces"})
"""Answered to GET (and HEAD) too; every other endpoint, writes above all, is POST only."""


RETRY_AFTER_S = 1
"""Retry-After (seconds) on a 503: a dependency is down or late (the embedder, the
database). Short: a query embedded before is answered from the query cache meanwhile, and
the embedder's circuit lets a trial call through within its cooldown."""


async def _json(
    status: int, payload: Any, *, size: int = 0, headers: dict[str, str] | None = None
) -> Response:
    body = await offload.run(dumps, payload, size=size) if size else dumps(payload)
    if status == 503:
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER_S)}
    return Response(body, status_code=status, media_type="application/json", headers=headers)
