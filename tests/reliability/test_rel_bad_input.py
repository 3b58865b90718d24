"""Bad input for every RPC of the five services — empty, huge, over a limit, unknown org
or namespace, malformed filters, NUL characters, non-finite vectors, wrong dimensions —
in one table: each request answers its documented status and leaves every table of the
database exactly as it was. The table runs twice: with the model services up, and with
them down, where a request that is bad on its face must still be INVALID_ARGUMENT (not
UNAVAILABLE because the embedder could not be asked first)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.struct_pb2 import Struct, Value
from google.protobuf.timestamp_pb2 import Timestamp

from dwsearch.common.rpcpolicy import MAX_MESSAGE_BYTES
from dwsearch.index.service import to_struct
from dwsearch.v1 import embedder_pb2, index_pb2, reranker_pb2, search_pb2, sweep_pb2
from dwsearch_testkit.reldb import fingerprint, seed_sessions

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
TOO_BIG = grpc.StatusCode.RESOURCE_EXHAUSTED
SKIP = None  # the service under test is itself down
DIM = 384  # multilingual-e5-small


def huge() -> str:
    """Just over the 64 MiB every server accepts in one message."""
    return "x" * (MAX_MESSAGE_BYTES + 1024)


def ts(value: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(value)
    return out


def nan_struct() -> Struct:
    struct = Struct()
    struct.fields["score"].number_value = math.nan
    return struct


def deep_value(depth: int, kind: str) -> Value:
    """A value nested `depth` objects ("object") or lists ("list") deep, built in place:
    a constructor, Struct.update or append would parse it and stop at protobuf's depth
    limit (100 levels: about 32 objects or 48 lists), as the server does."""
    value = Value(string_value="x")
    for _ in range(depth):
        outer = Value()
        if kind == "object":
            outer.struct_value.fields["a"].CopyFrom(value)
        else:
            outer.list_value.values.add().CopyFrom(value)
        value = outer
    return value


def deep_upsert(depth: int, kind: str) -> index_pb2.UpsertRequest:
    request = index_pb2.UpsertRequest()
    request.documents.add(id="d", data="text").metadata.fields["m"].CopyFrom(deep_value(depth, kind))
    return request


def deep_update(depth: int, kind: str) -> index_pb2.UpdateRequest:
    request = index_pb2.UpdateRequest(namespace="ns", id="k1")
    request.metadata.fields["m"].CopyFrom(deep_value(depth, kind))
    return request


def raw_ts(seconds: int, nanos: int = 0) -> Timestamp:
    """A Timestamp as any client may send it, in range or not."""
    return Timestamp(seconds=seconds, nanos=nanos)


BEFORE_YEAR_1 = -62_135_596_801
AFTER_YEAR_9999 = 253_402_300_800


def doc(doc_id: str = "d", data: str = "text", **fields: Any) -> index_pb2.Document:
    return index_pb2.Document(id=doc_id, data=data, **fields)


def search(**fields: Any) -> Callable:
    fields.setdefault("org_id", "org-a")
    fields.setdefault("query", "refund")
    return lambda s: s.search.Search(search_pb2.SearchRequest(**fields), timeout=60)


def sweep_call(**fields: Any) -> Callable:
    async def call(s):
        return [r async for r in s.sweep.Sweep(sweep_pb2.SweepRequest(**fields), timeout=60)]

    return call


def negative_duration() -> Duration:
    d = Duration()
    d.FromTimedelta(timedelta(seconds=-1))
    return d


def rpc(service: str, method: str, request: Any) -> Callable:
    return lambda s: getattr(getattr(s, service), method)(request, timeout=60)


NOW = datetime.now(UTC)
VEC = [0.1] * DIM

# (name, call, status with the models up, status with the models down)
CASES: list[tuple[str, Callable[[Any], Awaitable[Any]], grpc.StatusCode, grpc.StatusCode | None]] = [
    # --- SearchService.Search ------------------------------------------------------
    ("search: no org", search(org_id=""), INVALID, INVALID),
    ("search: empty query", search(query=""), INVALID, INVALID),
    ("search: blank query", search(query=" \t\n"), INVALID, INVALID),
    ("search: query over 8 KiB", search(query="退" * 3000), INVALID, INVALID),
    ("search: query over the message limit", lambda s: search(query=huge())(s), TOO_BIG, TOO_BIG),
    ("search: limit 101", search(limit=101), INVALID, INVALID),
    ("search: unknown mode", search(mode=42), INVALID, INVALID),
    ("search: inverted time range", search(start_time=ts(NOW), end_time=ts(NOW - timedelta(days=1))), INVALID,
     INVALID),
    ("search: start before year 1", search(start_time=raw_ts(BEFORE_YEAR_1)), INVALID, INVALID),
    ("search: end after year 9999", search(end_time=raw_ts(AFTER_YEAR_9999)), INVALID, INVALID),
    ("search: start nanos 10^9", search(start_time=raw_ts(0, 10**9)), INVALID, INVALID),
    ("search: end nanos negative", search(end_time=raw_ts(0, -1)), INVALID, INVALID),
    ("search: NUL in query", search(query="re\x00fund"), INVALID, INVALID),
    ("search: NUL in org", search(org_id="org\x00a"), INVALID, INVALID),
    ("search: NUL in provider", search(provider="wa\x00"), INVALID, INVALID),
    ("search: NUL in channel", search(external_channel_id="c\x00"), INVALID, INVALID),
    ("search: unknown org", search(org_id="no-such-org"), OK, OK),
    ("search: unknown channel", search(external_channel_id="no-such-channel"), OK, OK),
    # --- SweepService --------------------------------------------------------------
    ("sweep: negative max_duration", sweep_call(max_duration=negative_duration()), INVALID, INVALID),
    ("sweep: max_duration 2^62 s", sweep_call(max_duration=Duration(seconds=2**62)), INVALID, INVALID),
    ("sweep: max_duration -2^62 s", sweep_call(max_duration=Duration(seconds=-(2**62))), INVALID, INVALID),
    ("sweep: max_duration nanos 10^9", sweep_call(max_duration=Duration(seconds=1, nanos=10**9)), INVALID, INVALID),
    ("sweep: unknown org", sweep_call(org_id="no-such-org"), OK, UNAVAILABLE),  # down: the model check fails
    ("sweep: models down", sweep_call(org_id="org-a"), SKIP, UNAVAILABLE),
    ("status: unknown org", rpc("sweep", "Status", sweep_pb2.StatusRequest(org_id="no-such-org")), OK, OK),
    ("status: unknown model", rpc("sweep", "Status", sweep_pb2.StatusRequest(model="no/such-model")), OK, OK),
    ("status: NUL in org", rpc("sweep", "Status", sweep_pb2.StatusRequest(org_id="o\x00")), INVALID, INVALID),
    ("purge: no org", rpc("sweep", "Purge", sweep_pb2.PurgeRequest(cutoff=ts(NOW))), INVALID, INVALID),
    ("purge: no cutoff", rpc("sweep", "Purge", sweep_pb2.PurgeRequest(org_id="org-a")), INVALID, INVALID),
    ("purge: cutoff in the future",
     rpc("sweep", "Purge", sweep_pb2.PurgeRequest(org_id="org-a", cutoff=ts(NOW + timedelta(days=1)))), INVALID,
     INVALID),
    ("purge: NUL in org", rpc("sweep", "Purge", sweep_pb2.PurgeRequest(org_id="o\x00", cutoff=ts(NOW))), INVALID,
     INVALID),
    ("purge: blank org", rpc("sweep", "Purge", sweep_pb2.PurgeRequest(org_id=" \t", cutoff=ts(NOW))), INVALID,
     INVALID),
    ("purge: cutoff before year 1",
     rpc("sweep", "Purge", sweep_pb2.PurgeRequest(org_id="org-a", cutoff=raw_ts(BEFORE_YEAR_1))), INVALID, INVALID),
    ("purge: cutoff after year 9999",
     rpc("sweep", "Purge", sweep_pb2.PurgeRequest(org_id="org-a", cutoff=raw_ts(AFTER_YEAR_9999))), INVALID, INVALID),
    ("purge: cutoff nanos 10^9",
     rpc("sweep", "Purge", sweep_pb2.PurgeRequest(org_id="org-a", cutoff=raw_ts(0, 10**9))), INVALID, INVALID),
    ("forget: blank org", rpc("sweep", "Forget", sweep_pb2.ForgetRequest(
        org_id="  ", message_ids=["00000000-0000-0000-0000-000000000000"])), INVALID, INVALID),
    ("retry poison: not a UUID", rpc("sweep", "RetryPoison", sweep_pb2.RetryPoisonRequest(ids=["nope"])), INVALID,
     INVALID),
    ("retry poison: unknown id",
     rpc("sweep", "RetryPoison", sweep_pb2.RetryPoisonRequest(ids=["00000000-0000-0000-0000-000000000000"])), OK, OK),
    ("retry poison: NUL in org", rpc("sweep", "RetryPoison", sweep_pb2.RetryPoisonRequest(org_id="o\x00")), INVALID,
     INVALID),
    # --- IndexService --------------------------------------------------------------
    ("upsert: no documents", rpc("index", "Upsert", index_pb2.UpsertRequest(namespace="ns")), INVALID, INVALID),
    ("upsert: 1001 documents",
     rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc(f"d{i}") for i in range(1001)])), INVALID,
     INVALID),
    ("upsert: empty id", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc(""), doc("ok")])), INVALID,
     INVALID),
    ("upsert: id over 512 bytes", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc("é" * 257)])), INVALID,
     INVALID),
    ("upsert: no data, no vector", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc("ok"), doc("a", "")])),
     INVALID, INVALID),
    ("upsert: data over 128 KiB", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc(data="x" * 131073)])),
     INVALID, INVALID),
    ("upsert: NUL in data", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc(data="a\x00")])), INVALID,
     INVALID),
    ("upsert: NaN metadata", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc(metadata=nan_struct())])),
     INVALID, INVALID),
    # Past protobuf's parse depth: gRPC answered UNKNOWN "Unexpected DecodeError".
    ("upsert: metadata 49 objects deep", rpc("index", "Upsert", deep_upsert(49, "object")), INVALID, INVALID),
    ("upsert: metadata 95 lists deep", rpc("index", "Upsert", deep_upsert(95, "list")), INVALID, INVALID),
    # Parses, but over MAX_METADATA_DEPTH (32).
    ("upsert: metadata 40 lists deep", rpc("index", "Upsert", deep_upsert(40, "list")), INVALID, INVALID),
    ("upsert: namespace over 512 bytes",
     rpc("index", "Upsert", index_pb2.UpsertRequest(namespace="n" * 513, documents=[doc()])), INVALID, INVALID),
    ("upsert: NaN vector", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc(vector=[math.nan] * DIM)])),
     INVALID, INVALID),
    ("upsert: infinite vector", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc(vector=[math.inf] * DIM)])),
     INVALID, INVALID),
    ("upsert: beyond half precision",
     rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc(vector=[1e6] * DIM)])), INVALID, INVALID),
    # Writes ask the embedder for the model's dimension afresh.
    ("upsert: wrong dimension", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[doc(vector=[0.1] * 3)])),
     INVALID, UNAVAILABLE),
    ("upsert: sparse lengths differ", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[
        doc(vector=VEC, sparse_vector=embedder_pb2.SparseVector(indices=[1, 2], values=[1.0]))])), INVALID, INVALID),
    ("upsert: sparse without dense", rpc("index", "Upsert", index_pb2.UpsertRequest(documents=[
        doc(sparse_vector=embedder_pb2.SparseVector(indices=[1], values=[1.0]))])), INVALID, INVALID),
    ("query: nothing to query by", rpc("index", "Query", index_pb2.QueryRequest(namespace="ns")), INVALID, INVALID),
    ("query: blank data", rpc("index", "Query", index_pb2.QueryRequest(data=" ")), INVALID, INVALID),
    ("query: data over 32 KiB", rpc("index", "Query", index_pb2.QueryRequest(data="x" * 32769)), INVALID, INVALID),
    ("query: top_k 1001", rpc("index", "Query", index_pb2.QueryRequest(data="x", top_k=1001)), INVALID, INVALID),
    ("query: malformed filter", rpc("index", "Query", index_pb2.QueryRequest(data="x", filter="appId = 'x' AND")),
     INVALID, INVALID),
    ("query: injection in filter", rpc("index", "Query", index_pb2.QueryRequest(data="x", filter="a = 'x' OR 1=1 --")),
     INVALID, INVALID),
    ("query: unknown mode", rpc("index", "Query", index_pb2.QueryRequest(data="x", mode=7)), INVALID, INVALID),
    ("query: unknown fusion", rpc("index", "Query", index_pb2.QueryRequest(data="x", fusion=9)), INVALID, INVALID),
    ("query: NaN vector", rpc("index", "Query", index_pb2.QueryRequest(vector=index_pb2.DenseVector(
        values=[math.nan] * DIM))), INVALID, INVALID),
    # Reads reuse the model's description for a minute (MODEL_INFO_TTL_S), so these still
    # know the dimension with the embedder down.
    ("query: wrong dimension", rpc("index", "Query", index_pb2.QueryRequest(vector=index_pb2.DenseVector(
        values=[0.1] * 3))), INVALID, INVALID),
    # Dense and sparse vectors on a dense-only model: served DENSE, degraded with the reason
    # (SPARSE_UNSUPPORTED), as Search degrades; a sparse vector alone is still refused
    # (tests/index/test_index_errors.py::test_a_sparse_vector_alone_needs_a_model_with_sparse_vectors).
    ("query: sparse on a model without sparse", rpc("index", "Query", index_pb2.QueryRequest(
        vector=index_pb2.DenseVector(values=VEC), sparse_vector=embedder_pb2.SparseVector(indices=[1], values=[1.0]))),
     OK, OK),
    ("query: unknown namespace", rpc("index", "Query", index_pb2.QueryRequest(namespace="no-such-ns", data="x")), OK,
     UNAVAILABLE),
    ("fetch: no ids", rpc("index", "Fetch", index_pb2.FetchRequest(namespace="ns")), INVALID, INVALID),
    ("fetch: empty id", rpc("index", "Fetch", index_pb2.FetchRequest(ids=["a", ""])), INVALID, INVALID),
    ("fetch: 1001 ids", rpc("index", "Fetch", index_pb2.FetchRequest(ids=[f"d{i}" for i in range(1001)])), INVALID,
     INVALID),
    ("fetch: unknown namespace", rpc("index", "Fetch", index_pb2.FetchRequest(namespace="no-such-ns", ids=["k1"])), OK,
     OK),
    ("delete: no selector", rpc("index", "Delete", index_pb2.DeleteRequest(namespace="ns")), INVALID, INVALID),
    ("delete: empty filter", rpc("index", "Delete", index_pb2.DeleteRequest(namespace="ns", filter=" ")), INVALID,
     INVALID),
    ("delete: malformed filter", rpc("index", "Delete", index_pb2.DeleteRequest(namespace="ns", filter="type =")),
     INVALID, INVALID),
    ("delete: empty id list", rpc("index", "Delete", index_pb2.DeleteRequest(ids=index_pb2.IdList())), INVALID, INVALID),
    ("delete: unknown namespace",
     rpc("index", "Delete", index_pb2.DeleteRequest(namespace="no-such-ns", prefix="k")), OK, OK),
    ("range: limit 1001", rpc("index", "Range", index_pb2.RangeRequest(limit=1001)), INVALID, INVALID),
    ("range: forged cursor", rpc("index", "Range", index_pb2.RangeRequest(cursor="not a cursor")), INVALID, INVALID),
    ("range: unknown namespace", rpc("index", "Range", index_pb2.RangeRequest(namespace="no-such-ns")), OK, OK),
    ("update: empty id", rpc("index", "Update", index_pb2.UpdateRequest(data="x")), INVALID, INVALID),
    ("update: nothing to update", rpc("index", "Update", index_pb2.UpdateRequest(namespace="ns", id="k1")), INVALID,
     INVALID),
    ("update: NaN metadata", rpc("index", "Update", index_pb2.UpdateRequest(namespace="ns", id="k1",
                                                                          metadata=nan_struct())), INVALID, INVALID),
    ("update: metadata 49 objects deep", rpc("index", "Update", deep_update(49, "object")), INVALID, INVALID),
    ("update: metadata 40 lists deep", rpc("index", "Update", deep_update(40, "list")), INVALID, INVALID),
    ("update: unknown metadata mode", rpc("index", "Update", index_pb2.UpdateRequest(
        namespace="ns", id="k1", metadata=to_struct({}), metadata_mode=5)), INVALID, INVALID),
    ("update: unknown namespace", rpc("index", "Update", index_pb2.UpdateRequest(
        namespace="no-such-ns", id="k1", metadata=to_struct({"a": 1}))), OK, OK),
    ("context: no app", rpc("index", "BuildAgentContext", index_pb2.BuildAgentContextRequest(message="refund")),
     INVALID, INVALID),
    ("context: no message", rpc("index", "BuildAgentContext", index_pb2.BuildAgentContextRequest(app_id="app")),
     INVALID, INVALID),
    ("context: NUL in app", rpc("index", "BuildAgentContext", index_pb2.BuildAgentContextRequest(
        message="refund", app_id="a\x00")), INVALID, INVALID),
    ("context: 1001 known names", rpc("index", "BuildAgentContext", index_pb2.BuildAgentContextRequest(
        message="refund", app_id="app", known_names=["x"] * 1001)), INVALID, INVALID),
    # --- EmbedderService -----------------------------------------------------------
    ("embed: no inputs", rpc("embedder", "Embed", embedder_pb2.EmbedRequest()), INVALID, SKIP),
    ("embed: an empty input", rpc("embedder", "Embed", embedder_pb2.EmbedRequest(inputs=["a", ""])), INVALID, SKIP),
    ("embed: 257 inputs", rpc("embedder", "Embed", embedder_pb2.EmbedRequest(inputs=["a"] * 257)), INVALID, SKIP),
    ("embed: over the token limit", rpc("embedder", "Embed", embedder_pb2.EmbedRequest(inputs=["word " * 600])),
     INVALID, SKIP),
    ("embed: neither dense nor sparse", rpc("embedder", "Embed", embedder_pb2.EmbedRequest(inputs=["a"], dense=False)),
     INVALID, SKIP),
    ("embed: sparse from a dense-only model", rpc("embedder", "Embed", embedder_pb2.EmbedRequest(
        inputs=["a"], sparse=True)), PRECONDITION, SKIP),
    ("embed: over the message limit", lambda s: rpc("embedder", "Embed", embedder_pb2.EmbedRequest(
        inputs=[huge()]))(s), TOO_BIG, SKIP),
    ("count tokens: no inputs", rpc("embedder", "CountTokens", embedder_pb2.CountTokensRequest()), INVALID, SKIP),
    # --- RerankerService -----------------------------------------------------------
    ("rerank: empty query", rpc("reranker", "Rerank", reranker_pb2.RerankRequest(documents=["a"])), INVALID, SKIP),
    ("rerank: no documents", rpc("reranker", "Rerank", reranker_pb2.RerankRequest(query="q")), INVALID, SKIP),
    ("rerank: 513 documents", rpc("reranker", "Rerank", reranker_pb2.RerankRequest(query="q", documents=["d"] * 513)),
     INVALID, SKIP),
]  # fmt: skip


async def _status(call: Callable[[Any], Awaitable[Any]], stack: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call(stack)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return OK, ""


async def test_every_bad_request_answers_its_status_and_changes_nothing(make_stack):
    # Off: with the models down each query must reach the embedder, not the answer serve
    # cached for the same text while they were up.
    stack = await make_stack(query_cache_bytes=0)
    # Something in every table a request could touch: embedded windows, sweep state,
    # index documents.
    seed_sessions(stack.url, ["org-a"], channels=2, sessions=2, messages=3)
    [r async for r in stack.sweep.Sweep(sweep_pb2.SweepRequest(org_id="org-a", max_windows=2), timeout=60)]
    await stack.index.Upsert(index_pb2.UpsertRequest(namespace="ns", documents=[
        doc("k1", "refund policy", metadata=to_struct({"appId": "app", "type": "knowledge"}))]), timeout=60)  # fmt: skip
    before = fingerprint(stack.url)
    assert before["dw_message_embeddings"][0] == 2 and before["dw_index_documents"][0] == 1

    wrong: list[str] = []
    for models in ("up", "down"):
        if models == "down":
            await stack.stop_models()
        for name, call, up, down in CASES:
            expected = up if models == "up" else down
            if expected is SKIP:
                continue
            code, details = await _status(call, stack)
            if code != expected:
                wrong.append(
                    f"[models {models}] {name}: {code.name} ({details[:80]!r}), expected {expected.name}"
                )
            elif code is not OK and (not details or details == "internal error"):
                wrong.append(f"[models {models}] {name}: {code.name} without a useful message")
            if fingerprint(stack.url) != before:
                wrong.append(f"[models {models}] {name}: changed the database")
                before = fingerprint(stack.url)
    assert not wrong, "\n".join(wrong)
