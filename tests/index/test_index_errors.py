"""Bad requests: the right status, a message that names the problem, nothing embedded and
the database unchanged."""

from __future__ import annotations

import math

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct

from dwsearch.index.service import to_struct
from dwsearch.v1 import embedder_pb2
from dwsearch.v1 import index_pb2 as pb

DIMENSION = 32  # the fake embedder's
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def doc(doc_id: str, data: str = "", **fields) -> pb.Document:
    return pb.Document(id=doc_id, data=data, **fields)


def nan_metadata() -> Struct:
    struct = Struct()
    struct.fields["trustScore"].number_value = math.nan
    return struct


def upsert(*documents: pb.Document, **fields) -> tuple[str, pb.UpsertRequest]:
    return "Upsert", pb.UpsertRequest(documents=list(documents), **fields)


GOOD = doc("good", "fine text")

CASES = [
    # Upsert
    ("no documents", *upsert(), INVALID, "documents: 0 given"),
    ("too many documents", *upsert(*[doc(f"d{i}", "x") for i in range(1001)]), INVALID, "1001 given"),
    ("empty id", *upsert(GOOD, doc("", "x")), INVALID, "documents[1].id: empty"),
    ("id over 512 bytes", *upsert(doc("é" * 257, "x")), INVALID, "documents[0].id: 514 bytes"),
    ("NUL in id", *upsert(doc("a\x00b", "x")), INVALID, "NUL"),
    ("no data, no vector", *upsert(GOOD, doc("a")), INVALID, "documents[1]: needs data or a vector"),
    ("blank data", *upsert(doc("a", " \n ")), INVALID, "needs data or a vector"),
    ("NUL in data", *upsert(doc("a", "x\x00y")), INVALID, "documents[0].data: NUL"),
    ("data too long", *upsert(doc("a", "x" * (128 * 1024 + 1))), INVALID, "documents[0].data"),
    ("wrong dimension", *upsert(doc("a", vector=[0.1] * 3)), INVALID, "3 dimensions; the model has 32"),
    ("NaN in vector", *upsert(GOOD, doc("a", vector=[math.nan] * DIMENSION)), INVALID, "documents[1].vector"),
    ("infinite vector", *upsert(doc("a", vector=[math.inf] * DIMENSION)), INVALID, "not finite"),
    ("beyond half precision", *upsert(doc("a", vector=[1e5] * DIMENSION)), INVALID, "half-precision"),
    (
        "sparse without dense",
        *upsert(doc("a", "x", sparse_vector=embedder_pb2.SparseVector(indices=[1], values=[1.0]))),
        INVALID,
        "only with a dense vector",
    ),
    (
        "sparse lengths differ",
        *upsert(
            doc(
                "a",
                vector=[0.1] * DIMENSION,
                sparse_vector=embedder_pb2.SparseVector(indices=[1, 2], values=[1.0]),
            )
        ),
        INVALID,
        "2 indices but 1 values",
    ),
    (
        "sparse repeated index",
        *upsert(
            doc(
                "a",
                vector=[0.1] * DIMENSION,
                sparse_vector=embedder_pb2.SparseVector(indices=[1, 1], values=[1.0, 2.0]),
            )
        ),
        INVALID,
        "repeated index",
    ),
    (
        "NaN in metadata",
        *upsert(GOOD, doc("a", "x", metadata=nan_metadata())),
        INVALID,
        "documents[1].metadata.trustScore",
    ),
    ("namespace too long", *upsert(GOOD, namespace="n" * 513), INVALID, "namespace"),
    # Query
    ("no query", "Query", pb.QueryRequest(), INVALID, "give data, a vector or a sparse_vector"),
    ("empty query text", "Query", pb.QueryRequest(data="  "), INVALID, "data: empty"),
    ("top_k too large", "Query", pb.QueryRequest(data="x", top_k=1001), INVALID, "top_k: 1001"),
    (
        "malformed filter",
        "Query",
        pb.QueryRequest(data="x", filter="appId = 'x' AND"),
        INVALID,
        "filter: expected a field name at position 16",
    ),
    ("unterminated string", "Query", pb.QueryRequest(data="x", filter="appId = 'x"), INVALID, "position 9"),
    (
        "injection attempt",
        "Query",
        pb.QueryRequest(data="x", filter="appId = 'x' OR 1=1 --"),
        INVALID,
        "position 16",
    ),
    ("unknown mode", "Query", pb.QueryRequest(data="x", mode=7), INVALID, "mode: unknown value 7"),
    ("unknown fusion", "Query", pb.QueryRequest(data="x", fusion=9), INVALID, "fusion: unknown value 9"),
    (
        "query vector dimension",
        "Query",
        pb.QueryRequest(vector=pb.DenseVector(values=[1.0])),
        INVALID,
        "vector: 1 dimensions",
    ),
    (
        "hybrid without sparse",
        "Query",
        pb.QueryRequest(vector=pb.DenseVector(values=[0.1] * DIMENSION), mode=pb.QUERY_MODE_HYBRID),
        INVALID,
        "needs a sparse query vector",
    ),
    (
        "sparse mode without sparse",
        "Query",
        pb.QueryRequest(vector=pb.DenseVector(values=[0.1] * DIMENSION), mode=pb.QUERY_MODE_SPARSE),
        INVALID,
        "needs a sparse query vector",
    ),
    (
        "data and sparse vector",
        "Query",
        pb.QueryRequest(data="x", sparse_vector=embedder_pb2.SparseVector(indices=[1], values=[1.0])),
        INVALID,
        "not both",
    ),
    # Fetch
    ("fetch no ids", "Fetch", pb.FetchRequest(), INVALID, "ids: 0 given"),
    ("fetch empty id", "Fetch", pb.FetchRequest(ids=["a", ""]), INVALID, "ids[1]: empty"),
    ("fetch too many", "Fetch", pb.FetchRequest(ids=[f"d{i}" for i in range(1001)]), INVALID, "1001 given"),
    # Delete
    ("delete no selector", "Delete", pb.DeleteRequest(), INVALID, "exactly one of ids, prefix or filter"),
    ("delete empty id list", "Delete", pb.DeleteRequest(ids=pb.IdList()), INVALID, "ids: 0 given"),
    ("delete empty prefix", "Delete", pb.DeleteRequest(prefix=""), INVALID, "prefix: empty"),
    ("delete empty filter", "Delete", pb.DeleteRequest(filter="  "), INVALID, "whole namespace"),
    ("delete malformed filter", "Delete", pb.DeleteRequest(filter="type = "), INVALID, "position 8"),
    # Range
    ("range limit", "Range", pb.RangeRequest(limit=1001), INVALID, "limit: 1001"),
    ("range bad cursor", "Range", pb.RangeRequest(cursor="not a cursor"), INVALID, "cursor"),
    # Update
    ("update empty id", "Update", pb.UpdateRequest(data="x"), INVALID, "id: empty"),
    ("update nothing", "Update", pb.UpdateRequest(id="c1"), INVALID, "nothing to update"),
    ("update empty data", "Update", pb.UpdateRequest(id="c1", data=""), INVALID, "data: empty"),
    (
        "update unknown mode",
        "Update",
        pb.UpdateRequest(id="c1", metadata=to_struct({}), metadata_mode=5),
        INVALID,
        "metadata_mode: unknown value 5",
    ),
    (
        "update NaN metadata",
        "Update",
        pb.UpdateRequest(id="c1", metadata=nan_metadata()),
        INVALID,
        "metadata",
    ),
    # BuildAgentContext
    (
        "context without app",
        "BuildAgentContext",
        pb.BuildAgentContextRequest(message="refund"),
        INVALID,
        "app_id: required",
    ),
    (
        "context without message",
        "BuildAgentContext",
        pb.BuildAgentContextRequest(app_id="a"),
        INVALID,
        "message: empty",
    ),
]


@pytest.mark.parametrize(
    "method, request_, code, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_bad_request(stub, fake_embedder, snapshot, method, request_, code, fragment):
    await stub.Upsert(
        pb.UpsertRequest(documents=[doc("c1", "an existing document", metadata=to_struct({"n": 1}))])
    )
    embedded = list(fake_embedder.received)
    before = snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await getattr(stub, method)(request_)
    assert error.value.code() == code
    assert fragment in error.value.details()
    assert snapshot() == before
    assert fake_embedder.received == embedded


@pytest.mark.parametrize("mode", [pb.QUERY_MODE_SPARSE, pb.QUERY_MODE_HYBRID])
async def test_sparse_modes_on_a_dense_only_model_degrade_to_dense_with_the_reason(stub, fake_embedder, mode):
    """Like Search: an answer, dense only, saying why (not FAILED_PRECONDITION)."""
    from dwsearch.v1 import search_pb2

    fake_embedder.sparse_supported = False
    await stub.Upsert(pb.UpsertRequest(documents=[doc("a", "refund policy"), doc("b", "shipping times")]))
    dense = await stub.Query(pb.QueryRequest(data="refund policy", mode=pb.QUERY_MODE_DENSE))
    assert dense.mode == pb.QUERY_MODE_DENSE and not dense.degraded and not dense.degradations
    answer = await stub.Query(pb.QueryRequest(data="refund policy", mode=mode))
    assert [r.id for r in answer.results] == [r.id for r in dense.results]
    assert answer.mode == pb.QUERY_MODE_DENSE and answer.degraded
    [reason] = answer.degradations
    assert reason.reason == search_pb2.DEGRADATION_REASON_SPARSE_UNSUPPORTED
    assert "has no sparse vectors; dense only" in reason.detail
    # By vector too; a sparse_vector beside a dense one is dropped, saying so.
    vector = pb.DenseVector(values=[0.1] * DIMENSION)
    by_vector = await stub.Query(pb.QueryRequest(vector=vector, mode=mode))
    assert by_vector.degraded and by_vector.mode == pb.QUERY_MODE_DENSE and len(by_vector.results) == 2
    with_sparse = await stub.Query(
        pb.QueryRequest(vector=vector, sparse_vector=embedder_pb2.SparseVector(indices=[1], values=[0.5]))
    )
    assert with_sparse.degraded and "sparse_vector" in with_sparse.degradations[0].detail


async def test_unspecified_mode_serves_what_the_model_has(stub, fake_embedder):
    await stub.Upsert(pb.UpsertRequest(documents=[doc("a", "refund policy")]))
    answer = await stub.Query(pb.QueryRequest(data="refund"))
    assert answer.mode == pb.QUERY_MODE_HYBRID and not answer.degraded


async def test_a_sparse_vector_alone_needs_a_model_with_sparse_vectors(stub, fake_embedder):
    fake_embedder.sparse_supported = False
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Query(pb.QueryRequest(sparse_vector=embedder_pb2.SparseVector(indices=[1], values=[0.5])))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert fake_embedder.received == []


async def test_a_grpc_caller_cannot_name_a_rest_index_namespace(stub):
    import grpc

    from dwsearch.index.documents import SCOPED_NAMESPACE_SEPARATOR
    from dwsearch.v1 import index_pb2 as pb

    scoped = f"support{SCOPED_NAMESPACE_SEPARATOR}ns"
    calls = [
        stub.Upsert(pb.UpsertRequest(namespace=scoped, documents=[pb.Document(id="a", data="hello")])),
        stub.Fetch(pb.FetchRequest(namespace=scoped, ids=["a"])),
        stub.Query(pb.QueryRequest(namespace=scoped, data="hello")),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "U+001F" in error.value.details()
