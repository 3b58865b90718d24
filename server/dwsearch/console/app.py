"""The console as an ASGI (Starlette) app: its pages, its static files and its JSON API.

Every data call the pages make is a POST to `/api/{call}` carrying the operator's token as
a bearer header (typed into the page; no cookie, so no CSRF). A call is one gRPC call of
this process's own services (CALLS), made over a loopback channel with that header: the
interceptor that guards every RPC (dwsearch.common.interceptor) checks the token, its
scope, the request's size and the cap on calls in flight, exactly as for any client, and
the servicer runs the domain code the RPC runs. The two calls that are no RPC of serve's,
the orgs that have chat (`/api/orgs`) and the embedder's Info (`/api/models`), check the
token against the same Tokens, for the search scope; so do the Overview's calls: serve's
recent figures (`/api/overview`: dwsearch.console.history, search scope) and a page of
orgs with their figures (`/api/org-figures`: dwsearch.console.orgs, admin scope, as
SweepService.Status). The Map's points (`/api/map`: dwsearch.console.projection, search
scope) are an org's windows or an Index namespace's documents, read on the read pool and
projected to 2-D off the event loop. Every read of the database is a function of the
domain (dwsearch.sweep.overview, dwsearch.index.reads) on the pool serve hands the
console: the console runs no SQL of its own. `/api/auth` says whether tokens are needed
and the scope of the one sent (never 401): a page asks for nothing its token may not
read. JSON in and out is protobuf's own mapping (json_format).

Every response carries a strict Content-Security-Policy (CSP): scripts, styles, images
and calls from this origin only, nothing inline, no frames."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common import tracing
from dwsearch.common.errors import ResourceExhausted, classify
from dwsearch.common.grpcstatus import kind_of
from dwsearch.common.httpbody import BodyTooLarge, read_capped
from dwsearch.common.httpstatus import http_status
from dwsearch.common.rpcpolicy import MAX_MESSAGE_BYTES, Scope, Tokens
from dwsearch.console import orgs, projection
from dwsearch.console.history import History
from dwsearch.console.pages import PAGES, render
from dwsearch.db.readpool import ReadPool
from dwsearch.index.documents import MAX_NAMESPACE_BYTES, SCOPED_NAMESPACE_SEPARATOR
from dwsearch.sweep import overview
from dwsearch.v1 import index_pb2, search_pb2, sweep_pb2

STATIC = Path(__file__).parent / "static"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]

MAX_BODY_BYTES = 1024 * 1024
"""The largest API request body: a query, a filter, a list of poison window ids."""
CALL_TIMEOUT_S = 60.0
"""The deadline of each call the console makes of the services."""
MODEL_INFO_TIMEOUT_S = 5.0
"""The deadline of the Models page's Info call of the embedder."""
MAX_ORG_ID = 256
"""The longest org id /api/flags reads (as the RPCs' checks have it)."""


@dataclass(frozen=True)
class Call:
    """One console API call: the RPC it makes, and its request and response types."""

    method: str
    request: type[Message]
    response: type[Message]


def _method(file: Any, service: str, name: str) -> str:
    return f"/{file.DESCRIPTOR.services_by_name[service].full_name}/{name}"


CALLS = {
    "search": Call(
        _method(search_pb2, "SearchService", "Search"), search_pb2.SearchRequest, search_pb2.SearchResponse
    ),
    "index-query": Call(
        _method(index_pb2, "IndexService", "Query"), index_pb2.QueryRequest, index_pb2.QueryResponse
    ),
    "agent-context": Call(
        _method(index_pb2, "IndexService", "BuildAgentContext"),
        index_pb2.BuildAgentContextRequest,
        index_pb2.BuildAgentContextResponse,
    ),
    "sweep-status": Call(
        _method(sweep_pb2, "SweepService", "Status"), sweep_pb2.StatusRequest, sweep_pb2.StatusResponse
    ),
    "retry-poison": Call(
        _method(sweep_pb2, "SweepService", "RetryPoison"),
        sweep_pb2.RetryPoisonRequest,
        sweep_pb2.RetryPoisonResponse,
    ),
    "index-info": Call(
        _method(index_pb2, "IndexService", "Info"),
        index_pb2.IndexServiceInfoRequest,
        index_pb2.IndexServiceInfoResponse,
    ),
    "list-gaps": Call(
        _method(index_pb2, "IndexService", "ListKnowledgeGaps"),
        index_pb2.ListKnowledgeGapsRequest,
        index_pb2.ListKnowledgeGapsResponse,
    ),
    "forget-gaps": Call(
        _method(index_pb2, "IndexService", "ForgetKnowledgeGaps"),
        index_pb2.ForgetKnowledgeGapsRequest,
        index_pb2.ForgetKnowledgeGapsResponse,
    ),
}
"""Each API call the pages make, by name; nothing else is forwarded."""


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


AsgiScope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Asgi = Callable[[AsgiScope, Receive, Send], Awaitable[None]]


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every HTTP response (pages, static files, API)."""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class Console:
    """The console's app over `target`, this process's own gRPC address."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        tokens: Tokens,
        target: str,
        *,
        embedder: EmbedderClient | None = None,
        reranker_addr: str = "",
        reranker: RerankerClient | None = None,
        embed_deadline_ms: int = 0,
        model: str = "",
        history: History | None = None,
        read_pool: ReadPool | AsyncConnectionPool | None = None,
        fusion: Mapping[str, object] | None = None,
    ) -> None:
        self.pool = pool
        self.fusion = dict(fusion or {})  # Search's fusion profile, for the Models page
        self.read_pool = read_pool if read_pool is not None else pool  # the Map's reads
        self.model = model  # the sweep's model: the one the org figures count
        self.history = history if history is not None else History(embedder)
        self.reranker = reranker
        self.embed_deadline_ms = embed_deadline_ms
        self.tokens = tokens
        self.target = target
        self.embedder = embedder
        self.reranker_addr = reranker_addr
        self._channel: grpc.aio.Channel | None = None

    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:  # made on the serving loop, at the first call
            self._channel = grpc.aio.insecure_channel(
                self.target,
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
                interceptors=tracing.grpc_client_interceptors() or None,  # the page's trace goes on
            )
        return self._channel

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    def app(self) -> Asgi:
        routes = [
            Route("/", lambda request: RedirectResponse("/overview")),
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            *(Route(f"/{name}", self.page) for name in PAGES),
            Route("/api/auth", self.auth, methods=["POST"]),
            Route("/api/overview", self.overview, methods=["POST"]),
            Route("/api/org-figures", self.org_figures, methods=["POST"]),
            Route("/api/orgs", self.orgs, methods=["POST"]),
            Route("/api/models", self.models, methods=["POST"]),
            Route("/api/flags", self.flags, methods=["POST"]),
            Route("/api/map", self.map, methods=["POST"]),
            Route("/api/{call}", self.call, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC)),
        ]
        return SecurityHeaders(Starlette(routes=routes))

    async def page(self, request: Request) -> Response:
        return HTMLResponse(render(PAGES[request.url.path.strip("/")]))

    def _require(self, request: Request, scope: Scope, what: str) -> None:
        """The check the interceptor makes of an RPC, for the calls that are none: the
        bearer token against serve's Tokens, and its scope."""
        if not self.tokens:
            return
        granted = self.tokens.scope_of(request.headers.get("authorization", "").encode() or None)
        if granted is None:
            raise ApiError(401, "missing or invalid bearer token")
        if granted < scope:
            raise ApiError(403, f"{what} needs a token of the {scope.name.lower()} scope")

    async def auth(self, request: Request) -> Response:
        """Whether serve needs a token, and the scope of the one sent (null: none, or not
        one of serve's); a 200 either way."""
        if not self.tokens:
            return JSONResponse({"required": False, "scope": Scope.ADMIN.name.lower()})
        granted = self.tokens.scope_of(request.headers.get("authorization", "").encode() or None)
        return JSONResponse(
            {"required": True, "scope": granted.name.lower() if granted is not None else None}
        )

    async def overview(self, request: Request) -> Response:
        """serve's recent figures (dwsearch.console.history), oldest point first."""
        try:
            self._require(request, Scope.SEARCH, "the overview")
        except ApiError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        await self.history.recheck_embedder()
        return JSONResponse({**self.history.as_json(), "model": self.model, "now": time.time()})

    async def org_figures(self, request: Request) -> Response:
        """A page of orgs with their figures: {"query": text in the org id, "after": the
        last org of the page before, "limit": 1..100}; admin scope, as Status."""
        try:
            self._require(request, Scope.ADMIN, "the orgs' figures")
            body = await _json_object(request)
            query, after, limit = body.get("query", ""), body.get("after", ""), body.get("limit", orgs.PAGE)
            for name, value in (("query", query), ("after", after)):
                if not isinstance(value, str) or len(value) > orgs.MAX_QUERY:
                    raise ApiError(400, f"{name}: a string of at most {orgs.MAX_QUERY} characters")
            if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= orgs.MAX_PAGE:
                raise ApiError(400, f"limit: a whole number from 1 to {orgs.MAX_PAGE}")
            rows, next_after = await overview.org_figures(
                self.pool, self.model, query=query.strip(), after=after, limit=limit
            )
            now = orgs.now()
            return JSONResponse(
                {"model": self.model, "orgs": [orgs.as_json(r, now) for r in rows], "next_after": next_after}
            )
        except ApiError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)

    async def orgs(self, request: Request) -> Response:
        try:
            self._require(request, Scope.SEARCH, "listing orgs")
            return JSONResponse({"orgs": await overview.orgs_with_chat(self.pool, orgs.MAX_ORGS)})
        except ApiError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)

    async def flags(self, request: Request) -> Response:
        """Whether an org's feature flags let the sweep embed it, and if not which are off
        (dwsearch.flags, as the sweep reads them); admin scope, as Status."""
        try:
            self._require(request, Scope.ADMIN, "an org's flags")
            org_id = (await _json_object(request)).get("org_id")
            if not isinstance(org_id, str) or not org_id.strip() or len(org_id) > MAX_ORG_ID:
                raise ApiError(400, f"org_id: a non-empty string of at most {MAX_ORG_ID} characters")
            reason = await overview.disabled_reason(self.pool, org_id)
            return JSONResponse({"org_id": org_id, "swept": not reason, "reason": reason})
        except ApiError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)

    async def map(self, request: Request) -> Response:
        """The Map's points: {"org_id": an org} (its conversation windows) or {"namespace":
        an Index namespace, "" the default one} (its documents), with "limit": 1..MAX_POINTS;
        the most recent rows of the sweep's model (the Index's too), projected to 2-D
        (dwsearch.console.projection). Search scope."""
        try:
            self._require(request, Scope.SEARCH, "the map")
            body = await _json_object(request)
            limit = body.get("limit", projection.MAX_POINTS)
            if (
                not isinstance(limit, int)
                or isinstance(limit, bool)
                or not 1 <= limit <= projection.MAX_POINTS
            ):
                raise ApiError(400, f"limit: a whole number from 1 to {projection.MAX_POINTS}")
            namespace, org_id = body.get("namespace"), body.get("org_id")
            if namespace is not None:
                if not isinstance(namespace, str) or len(namespace.encode()) > MAX_NAMESPACE_BYTES:
                    raise ApiError(400, f"namespace: a string of at most {MAX_NAMESPACE_BYTES} bytes")
                if "\x00" in namespace or SCOPED_NAMESPACE_SEPARATOR in namespace:
                    raise ApiError(404, "no such namespace in the Index")
                found = await projection.namespace_documents(self.read_pool, namespace, self.model, limit)
                if not found.points:
                    raise ApiError(404, f"no such namespace in the Index: {namespace or '(default)'!r}")
                where = {"namespace": namespace}
            else:
                if not isinstance(org_id, str) or not org_id.strip() or len(org_id) > MAX_ORG_ID:
                    raise ApiError(
                        400, f"org_id (or namespace): a non-empty string of at most {MAX_ORG_ID} characters"
                    )
                if "\x00" in org_id:
                    raise ApiError(400, "org_id: NUL character")
                found = await projection.org_windows(self.read_pool, org_id, self.model, limit)
                where = {"org_id": org_id}
            return JSONResponse({**where, "model": self.model, "limit": limit, **found.as_json()})
        except ResourceExhausted as e:
            return JSONResponse({"error": str(e)}, status_code=429)
        except ApiError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)

    async def models(self, request: Request) -> Response:
        """The embedder's and the reranker's Info answers (model, runtime, the runtime's
        report: CPU class and quantization; the embedder's measured query latency beside
        serve's embed deadline), or why one cannot be reached; and Search's fusion (the
        models' fusion profile and what is served)."""
        try:
            self._require(request, Scope.SEARCH, "the models' Info")
        except ApiError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        embedder: dict[str, Any] = {"error": "no embedder configured"}
        if self.embedder is not None:
            try:
                answer = await self.embedder.describe(timeout=MODEL_INFO_TIMEOUT_S)
                embedder = {"address": self.embedder.target, **_as_dict(answer)}
                if self.embed_deadline_ms:
                    embedder["embed_deadline_ms"] = self.embed_deadline_ms
            except Exception as e:  # down, or another model: said, as a search would say it
                embedder = {"address": self.embedder.target, "error": classify(e).message}
        reranker: dict[str, Any] = {"error": "no reranker configured"}
        if self.reranker is not None:
            try:
                reranker = {
                    "address": self.reranker_addr,
                    **_as_dict(await self.reranker.info(timeout=MODEL_INFO_TIMEOUT_S)),
                }
            except Exception as e:
                reranker = {"address": self.reranker_addr, "error": classify(e).message}
        elif self.reranker_addr:
            reranker = {"address": self.reranker_addr}
        return JSONResponse({"embedder": embedder, "reranker": reranker, "fusion": self.fusion})

    async def call(self, request: Request) -> Response:
        try:
            call = CALLS.get(request.path_params["call"])
            if call is None:
                raise ApiError(404, f"no such call: {request.path_params['call']}")
            message = await _request_message(request, call)
            header = request.headers.get("authorization", "")
            rpc = self.channel().unary_unary(
                call.method,
                request_serializer=call.request.SerializeToString,
                response_deserializer=call.response.FromString,
            )
            try:
                response = await rpc(
                    message, metadata=[("authorization", header)] if header else None, timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as e:
                raise ApiError(http_status(kind_of(e.code())), e.details() or e.code().name) from None
            return JSONResponse(
                json_format.MessageToDict(
                    response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
                ),
                headers=_trace_header(),
            )
        except ApiError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)


TRACE_HEADER = "Dwsearch-Trace-Id"
"""The trace a call's answer was made in (when serve traces): the page shows a search's."""


def _trace_header() -> dict[str, str] | None:
    trace_id = tracing.current_trace_id()
    return {TRACE_HEADER: trace_id} if trace_id else None


async def _json_object(request: Request) -> dict[str, Any]:
    """The request's body: a JSON object ({} when empty), within MAX_BODY_BYTES."""
    try:
        body = await read_capped(request, MAX_BODY_BYTES)
    except BodyTooLarge as e:
        raise ApiError(413, str(e)) from None
    try:
        document = json.loads(body or b"{}")
    except ValueError:
        raise ApiError(400, "the request body: not JSON") from None
    if not isinstance(document, dict):
        raise ApiError(400, "the request body: not a JSON object")
    return document


async def _request_message(request: Request, call: Call) -> Message:
    try:
        body = await read_capped(request, MAX_BODY_BYTES)  # the HTTP ports' one capped read
    except BodyTooLarge as e:
        raise ApiError(413, str(e)) from None
    try:
        document = json.loads(body or b"{}")
        return json_format.ParseDict(document, call.request())
    except (ValueError, json_format.ParseError) as e:
        raise ApiError(400, f"the request: {e}") from None


def _as_dict(message: Message) -> dict[str, Any]:
    """A model service's Info answer as JSON fields (every field, its proto name), its
    runtime report flattened (cpu_class, quantization, …)."""
    fields = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    report = fields.pop("runtime_report", None) or {}
    return {**fields, **{k: v for k, v in report.items() if k != "quantization_check"}}
