"""IndexService over real gRPC and Postgres: upsert, query modes and fusions, fetch,
delete, range, update, info, redaction before anything is embedded or stored."""

from __future__ import annotations

import grpc
import psycopg
import psycopg.types.json
import pytest
from pgvector import HalfVector, SparseVector
from pgvector.psycopg import register_vector

from dwsearch.index.context import Section, section_filter
from dwsearch.index.documents import Include
from dwsearch.index.service import from_struct, to_struct
from dwsearch.index.store import NamespaceScope, nearest_statement
from dwsearch.v1 import embedder_pb2
from dwsearch.v1 import index_pb2 as pb
from dwsearch_testkit.fakes import FAKE_MODEL, FAKE_SPARSE_DIMENSION, fake_sparse, fake_vector

DIMENSION = 32  # the fake embedder's


def doc(doc_id: str, data: str = "", *, vector: list[float] | None = None, **metadata) -> pb.Document:
    return pb.Document(id=doc_id, data=data, metadata=to_struct(metadata), vector=vector or [])


def ids(results) -> list[str]:
    return [r.id for r in results]


CORPUS = [
    doc("c1", "refund for a broken blender", type="conversation", appId="a1", resolution="refund"),
    doc("c2", "parcel arrived late", type="conversation", appId="a1", resolution="escalated"),
    doc("k1", "how refunds work for broken items", type="knowledge", appId="a1", source="faq"),
    doc("r1", "we have refunded your order", type="response", appId="a1", trustScore=0.9),
    doc("r2", "please wait", type="response", appId="a2", trustScore=0.99),
]


@pytest.fixture
async def corpus(stub):
    await stub.Upsert(pb.UpsertRequest(documents=CORPUS))
    return stub


# --- Upsert ----------------------------------------------------------------------------


async def test_upsert_stores_and_embeds_each_distinct_text_once(stub, fake_embedder, db_url):
    documents = [doc("a", "same text"), doc("b", "same text"), doc("c", "other text"), doc("d", "same text")]
    response = await stub.Upsert(pb.UpsertRequest(namespace="ns", documents=documents))
    assert (response.upserted, response.embedded) == (4, 2)
    assert sorted(fake_embedder.received) == ["other text", "same text"]
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT id, data, model, sparse IS NOT NULL FROM dw_index_documents ORDER BY id"
        ).fetchall()
    assert rows == [
        (i, t, FAKE_MODEL, True)
        for i, t in [("a", "same text"), ("b", "same text"), ("c", "other text"), ("d", "same text")]
    ]


async def test_upsert_is_idempotent_by_id(stub, snapshot):
    request = pb.UpsertRequest(documents=[doc("a", "text one", n=1), doc("b", "text two")])
    await stub.Upsert(request)
    first = snapshot()
    await stub.Upsert(request)
    again = snapshot()
    assert [row[:-1] for row in again] == [row[:-1] for row in first]  # all but updated_at
    await stub.Upsert(pb.UpsertRequest(documents=[doc("a", "text one, changed", n=2)]))
    fetched = await stub.Fetch(pb.FetchRequest(ids=["a", "b"], include_data=True, include_metadata=True))
    assert [(d.id, d.data, from_struct(d.metadata)) for d in fetched.documents] == [
        ("a", "text one, changed", {"n": 2.0}),
        ("b", "text two", {}),
    ]
    assert snapshot()[0][7] == first[0][7]  # created_at survives a replace


async def test_a_later_duplicate_id_in_one_batch_wins(stub):
    response = await stub.Upsert(pb.UpsertRequest(documents=[doc("a", "first"), doc("a", "second")]))
    assert response.upserted == 1
    fetched = await stub.Fetch(pb.FetchRequest(ids=["a"], include_data=True))
    assert fetched.documents[0].data == "second"


async def test_vector_documents_are_stored_as_given(stub, fake_embedder):
    vector = [0.25] * DIMENSION
    sparse = embedder_pb2.SparseVector(indices=[7, 3], values=[0.5, 1.5])
    document = pb.Document(id="v", data="kept, not embedded", vector=vector, sparse_vector=sparse)
    response = await stub.Upsert(pb.UpsertRequest(documents=[document, pb.Document(id="w", vector=vector)]))
    assert (response.upserted, response.embedded) == (2, 0)
    assert fake_embedder.received == []
    fetched = await stub.Fetch(pb.FetchRequest(ids=["v", "w"], include_data=True, include_vectors=True))
    v, w = fetched.documents
    assert list(v.vector) == vector and v.data == "kept, not embedded"
    assert dict(zip(v.sparse_vector.indices, v.sparse_vector.values, strict=True)) == {3: 1.5, 7: 0.5}
    assert w.data == "" and not w.HasField("sparse_vector")


async def test_upsert_metadata_keeps_integers_integral(stub, db_url):
    await stub.Upsert(pb.UpsertRequest(documents=[doc("a", "x", touchCount=3, trustScore=0.9, tags=["vip"])]))
    with psycopg.connect(db_url) as conn:
        (stored,) = conn.execute("SELECT metadata FROM dw_index_documents").fetchone()
    assert stored == {"touchCount": 3, "trustScore": 0.9, "tags": ["vip"]}
    assert isinstance(stored["touchCount"], int)


async def test_large_upsert_is_embedded_in_batches(stub, fake_embedder):
    documents = [doc(f"d{i:04d}", f"text number {i}") for i in range(1000)]
    response = await stub.Upsert(pb.UpsertRequest(documents=documents))
    assert (response.upserted, response.embedded) == (1000, 1000)
    assert fake_embedder.calls > 1 and len(fake_embedder.received) == 1000
    info = await stub.Info(pb.IndexServiceInfoRequest())
    assert info.document_count == 1000


# --- Redaction -------------------------------------------------------------------------

PII = ["siti@example.com", "+60 12-345 6789", "4111 1111 1111 1111", "Siti Aminah", "900101-14-5678"]


async def test_nothing_unredacted_reaches_the_embedder_or_the_table(
    make_stub, fake_embedder, fake_reranker, db_url, monkeypatch
):
    from dwsearch_testkit.fakes import FakeReranker

    rerank_queries: list[str] = []
    original = FakeReranker.raw_score

    def recording(query: str, document: str) -> float:
        rerank_queries.append(query)
        return original(query, document)

    monkeypatch.setattr(FakeReranker, "raw_score", staticmethod(recording))
    stub = await make_stub(reranker=fake_reranker.address)
    text = "Siti Aminah (siti@example.com, +60 12-345 6789, IC 900101-14-5678) paid with 4111 1111 1111 1111"
    await stub.Upsert(
        pb.UpsertRequest(
            documents=[
                doc("c1", text, type="conversation", appId="a"),
                pb.Document(id="v1", data=text, vector=[0.1] * DIMENSION, metadata=to_struct({"appId": "a"})),
            ],
            known_names=["Siti Aminah"],
        )
    )
    unnamed = text.replace("Siti Aminah", "The customer")  # Update and Query take no known names
    await stub.Update(pb.UpdateRequest(id="c1", data=unnamed.replace("paid", "refunded")))
    await stub.Query(pb.QueryRequest(data=unnamed, include_data=True))
    for rerank in (False, True):
        await stub.BuildAgentContext(
            pb.BuildAgentContextRequest(message=text, app_id="a", rerank=rerank, known_names=["siti aminah"])
        )

    with psycopg.connect(db_url) as conn:
        stored = [row[0] for row in conn.execute("SELECT data FROM dw_index_documents")]
    assert fake_embedder.received and rerank_queries and len(stored) == 2
    for seen in [*fake_embedder.received, *stored, *rerank_queries]:
        assert not [p for p in PII if p in seen], seen
    assert (
        "[EMAIL]" in stored[0] and "[PHONE]" in stored[0] and "[CARD]" in stored[0] and "[NRIC]" in stored[0]
    )
    assert any("[NAME]" in text for text in fake_embedder.received)


# --- Query -----------------------------------------------------------------------------


async def test_dense_query_ranks_by_inner_product(corpus):
    text = "how refunds work for broken items"
    response = await corpus.Query(pb.QueryRequest(data=text, mode=pb.QUERY_MODE_DENSE, top_k=5))
    assert ids(response.results)[0] == "k1"
    assert response.results[0].score == pytest.approx(1.0, abs=1e-2)  # the same text: unit vectors, ip ~ 1
    scores = [r.score for r in response.results]
    assert scores == sorted(scores, reverse=True) and len(scores) == 5


async def test_sparse_query_returns_only_overlapping_documents(corpus):
    response = await corpus.Query(pb.QueryRequest(data="broken blender", mode=pb.QUERY_MODE_SPARSE))
    assert set(ids(response.results)) == {"c1", "k1"}  # "broken" in both, "blender" in c1 only
    assert ids(response.results)[0] == "c1"
    weights = fake_sparse("broken blender")
    expected = sum(w * fake_sparse("refund for a broken blender").get(k, 0.0) for k, w in weights.items())
    assert response.results[0].score == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "fusion", [pb.FUSION_ALGORITHM_RRF, pb.FUSION_ALGORITHM_DBSF, pb.FUSION_ALGORITHM_UNSPECIFIED]
)
async def test_hybrid_query_fuses_both_sources(corpus, fusion):
    request = pb.QueryRequest(
        data="how refunds work for broken items", mode=pb.QUERY_MODE_HYBRID, fusion=fusion, top_k=3
    )
    response = await corpus.Query(request)
    assert ids(response.results)[0] == "k1"  # first in dense and in sparse
    assert len(response.results) == 3
    if fusion == pb.FUSION_ALGORITHM_DBSF:
        assert 1.0 < response.results[0].score <= 2.0  # two normalized scores
    else:
        assert response.results[0].score == pytest.approx(2 / 60)


async def test_unspecified_mode_is_hybrid_with_sparse_else_dense(corpus, make_stub, fake_embedder):
    request = pb.QueryRequest(data="how refunds work for broken items", top_k=1)
    hybrid = await corpus.Query(request)
    assert hybrid.results[0].score == pytest.approx(2 / 60)
    fake_embedder.sparse_supported = False
    dense_only = await (await make_stub()).Query(request)  # a fresh server: no cached model info
    assert dense_only.results[0].score == pytest.approx(1.0, abs=1e-2)


async def test_query_by_vector_and_sparse_vector(corpus):
    vector = pb.DenseVector(values=fake_vector("please wait", DIMENSION).tolist())
    dense = await corpus.Query(pb.QueryRequest(vector=vector, top_k=1))
    assert ids(dense.results) == ["r2"]
    weights = fake_sparse("blender")
    sparse = embedder_pb2.SparseVector(indices=list(weights), values=list(weights.values()))
    only_sparse = await corpus.Query(pb.QueryRequest(sparse_vector=sparse))
    assert ids(only_sparse.results) == ["c1"]
    hybrid = await corpus.Query(pb.QueryRequest(vector=vector, sparse_vector=sparse, top_k=2))
    assert set(ids(hybrid.results)) == {"r2", "c1"}


async def test_query_filter_and_includes(corpus):
    response = await corpus.Query(
        pb.QueryRequest(
            data="refund",
            filter="appId = 'a1' AND type = 'response' AND trustScore > 0.85",
            include_data=True,
            include_metadata=True,
            include_vectors=True,
        )
    )
    (result,) = response.results
    assert result.id == "r1" and result.data == "we have refunded your order"
    assert from_struct(result.metadata) == {"type": "response", "appId": "a1", "trustScore": 0.9}
    assert len(result.vector) == DIMENSION and len(result.sparse_vector.indices) > 0
    bare = await corpus.Query(pb.QueryRequest(data="refund", top_k=1))
    assert (
        bare.results[0].data == "" and not bare.results[0].HasField("metadata") and not bare.results[0].vector
    )


async def test_top_k_defaults_to_ten(stub):
    await stub.Upsert(pb.UpsertRequest(documents=[doc(f"d{i}", f"document {i}") for i in range(15)]))
    response = await stub.Query(pb.QueryRequest(data="document", mode=pb.QUERY_MODE_DENSE))
    assert len(response.results) == 10


async def test_unknown_namespace_is_empty_not_an_error(corpus):
    assert not (await corpus.Query(pb.QueryRequest(namespace="nobody", data="refund"))).results
    fetched = await corpus.Fetch(pb.FetchRequest(namespace="nobody", ids=["c1"]))
    assert list(fetched.missing_ids) == ["c1"]
    assert not (await corpus.Range(pb.RangeRequest(namespace="nobody"))).documents


async def test_documents_of_another_model_are_invisible(corpus, db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE dw_index_documents SET model = 'old/model' WHERE id = 'k1'")
    response = await corpus.Query(pb.QueryRequest(data="how refunds work for broken items", top_k=10))
    assert "k1" not in ids(response.results)
    assert list((await corpus.Fetch(pb.FetchRequest(ids=["k1"]))).missing_ids) == ["k1"]
    info = await corpus.Info(pb.IndexServiceInfoRequest())
    assert info.document_count == len(CORPUS) - 1
    # Deleting goes across models, so switching back cannot resurrect the document.
    assert (await corpus.Delete(pb.DeleteRequest(ids=pb.IdList(ids=["k1"])))).deleted == 1


@pytest.mark.parametrize("section", list(Section))
def test_seed_filters_use_the_app_type_index(db_url, section):
    statement, params = nearest_statement(
        NamespaceScope("", FAKE_MODEL),
        section_filter("a1", section),
        3,
        Include(data=True, metadata=True),
        dense=HalfVector([0.1] * DIMENSION),
        sparse=SparseVector({1: 1.0}, FAKE_SPARSE_DIMENSION),
    )
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        conn.execute("SET enable_seqscan = off")  # an empty table: the planner would rightly scan it
        plan = "\n".join(row[0] for row in conn.execute(b"EXPLAIN " + statement.as_bytes(conn), params))
    assert plan.count("dw_index_documents_app_type_idx") == 2, plan  # dense and sparse
    assert "(metadata ->> 'appId'::text) = " in plan and "(metadata ->> 'type'::text) = " in plan, plan


def test_rows_with_a_1024_dimension_vector_stay_whole_in_the_heap(db_url):
    """Metadata and sparse weights are read for every candidate row: out of line (TOAST)
    each read would cost extra page reads."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(
            "INSERT INTO dw_index_documents (namespace, id, data, metadata, model, embedding, sparse)"
            " VALUES ('', 'a', %s, %s, 'm', %s, %s)",
            [
                "x" * 1500,
                psycopg.types.json.Jsonb({"title": "y" * 2000}),
                HalfVector([0.5] * 1024),
                SparseVector({i: 1.0 for i in range(100)}, 1000),
            ],
        )
        (toasted,) = conn.execute(
            "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'dw_index_documents'"
            " AND relnamespace = current_schema()::regnamespace"
        ).fetchone()
    assert toasted == 0


# --- Fetch, Delete, Range, Update, Info --------------------------------------------------


async def test_fetch_in_request_order_with_missing(corpus):
    response = await corpus.Fetch(pb.FetchRequest(ids=["r1", "nope", "c1"], include_metadata=True))
    assert ids(response.documents) == ["r1", "c1"] and list(response.missing_ids) == ["nope"]
    assert from_struct(response.documents[0].metadata)["trustScore"] == 0.9
    assert response.documents[0].data == ""


async def test_delete_by_ids(corpus):
    response = await corpus.Delete(pb.DeleteRequest(ids=pb.IdList(ids=["c1", "k1", "absent"])))
    assert response.deleted == 2
    assert list((await corpus.Fetch(pb.FetchRequest(ids=["c1", "k1", "c2"]))).missing_ids) == ["c1", "k1"]


async def test_delete_by_prefix(stub):
    names = ["doc-1", "doc-2", "doc-10", "doc", "docs-1", "other", "doc-\U0010ffff"]
    await stub.Upsert(pb.UpsertRequest(documents=[doc(n, n) for n in names]))
    await stub.Upsert(pb.UpsertRequest(namespace="elsewhere", documents=[doc("doc-1", "x")]))
    assert (await stub.Delete(pb.DeleteRequest(prefix="doc-"))).deleted == 4
    remaining = await stub.Range(pb.RangeRequest())
    assert ids(remaining.documents) == ["doc", "docs-1", "other"]
    assert ids((await stub.Range(pb.RangeRequest(namespace="elsewhere"))).documents) == ["doc-1"]


async def test_delete_by_filter(corpus):
    response = await corpus.Delete(pb.DeleteRequest(filter="type = 'response' OR resolution = 'escalated'"))
    assert response.deleted == 3
    assert ids((await corpus.Range(pb.RangeRequest())).documents) == ["c1", "k1"]


async def test_range_pages_cover_every_id_exactly_once(stub):
    all_ids = sorted({f"id-{i:03d}" for i in range(0, 250)} | {"Z", "a", "é", "中", "id-1", "id-10"})
    for start in range(0, len(all_ids), 100):
        await stub.Upsert(
            pb.UpsertRequest(documents=[doc(i, f"text {i}") for i in all_ids[start : start + 100]])
        )
    seen, cursor, pages = [], "", 0
    while True:
        page = await stub.Range(pb.RangeRequest(cursor=cursor, limit=37))
        seen += ids(page.documents)
        pages += 1
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    assert seen == sorted(all_ids, key=lambda s: s.encode())  # code-point order
    assert pages == -(-len(all_ids) // 37)
    default = await stub.Range(pb.RangeRequest())
    assert len(default.documents) == 100 and default.next_cursor


async def test_range_with_prefix(stub):
    await stub.Upsert(pb.UpsertRequest(documents=[doc(i, i) for i in ["a-1", "a-2", "a-3", "ab", "b-1"]]))
    first = await stub.Range(pb.RangeRequest(prefix="a-", limit=2, include_data=True))
    assert ids(first.documents) == ["a-1", "a-2"] and first.documents[0].data == "a-1"
    second = await stub.Range(pb.RangeRequest(prefix="a-", limit=2, cursor=first.next_cursor))
    assert ids(second.documents) == ["a-3"] and second.next_cursor == ""


async def test_update_patch_merges_and_null_deletes(corpus):
    patch = to_struct({"resolution": None, "category": "billing", "extra": {"x": 1}})
    assert (await corpus.Update(pb.UpdateRequest(id="c1", metadata=patch))).updated
    fetched = await corpus.Fetch(pb.FetchRequest(ids=["c1"], include_metadata=True, include_data=True))
    assert from_struct(fetched.documents[0].metadata) == {
        "type": "conversation",
        "appId": "a1",
        "category": "billing",
        "extra": {"x": 1.0},
    }
    assert fetched.documents[0].data == "refund for a broken blender"


async def test_update_overwrite_replaces_metadata(corpus):
    request = pb.UpdateRequest(
        id="c1", metadata=to_struct({"type": "knowledge"}), metadata_mode=pb.METADATA_UPDATE_MODE_OVERWRITE
    )
    assert (await corpus.Update(request)).updated
    fetched = await corpus.Fetch(pb.FetchRequest(ids=["c1"], include_metadata=True))
    assert from_struct(fetched.documents[0].metadata) == {"type": "knowledge"}


async def test_update_data_is_redacted_and_reembedded(corpus, fake_embedder):
    new = "call me at siti@example.com about the toaster"
    assert (await corpus.Update(pb.UpdateRequest(id="c1", data=new))).updated
    redacted = "call me at [EMAIL] about the toaster"
    assert fake_embedder.received[-1] == redacted
    fetched = await corpus.Fetch(pb.FetchRequest(ids=["c1"], include_data=True, include_metadata=True))
    assert fetched.documents[0].data == redacted
    assert from_struct(fetched.documents[0].metadata)["resolution"] == "refund"
    found = await corpus.Query(pb.QueryRequest(data=redacted, mode=pb.QUERY_MODE_DENSE, top_k=1))
    assert ids(found.results) == ["c1"]


async def test_update_of_a_missing_document_says_so(corpus, snapshot):
    before = snapshot()
    assert not (await corpus.Update(pb.UpdateRequest(id="nope", metadata=to_struct({"a": 1})))).updated
    assert not (await corpus.Update(pb.UpdateRequest(namespace="other", id="c1", data="x"))).updated
    assert snapshot() == before


async def test_info_counts_per_namespace(corpus):
    await corpus.Upsert(pb.UpsertRequest(namespace="tenant-b", documents=[doc("x", "y"), doc("z", "w")]))
    info = await corpus.Info(pb.IndexServiceInfoRequest())
    assert info.document_count == len(CORPUS) + 2
    assert {n.namespace: n.document_count for n in info.namespaces} == {"": len(CORPUS), "tenant-b": 2}
    assert (info.dimension, info.model, info.sparse_supported) == (DIMENSION, FAKE_MODEL, True)


# --- Failures ----------------------------------------------------------------------------


async def test_upsert_refuses_an_embedder_serving_another_model(stub, fake_embedder, snapshot):
    fake_embedder.model_id = "someone/else"
    before = snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Upsert(pb.UpsertRequest(documents=[doc("a", "x")]))
    assert (
        error.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "someone/else" in error.value.details()
    )
    assert snapshot() == before and fake_embedder.received == []


async def test_upsert_with_the_embedder_down_writes_nothing(make_stub, snapshot):
    stub = await make_stub(embedder="127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Upsert(pb.UpsertRequest(documents=[doc("a", "x")]))
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert snapshot() == []


async def test_upsert_is_all_or_nothing_when_the_database_fails(corpus, db_url, snapshot):
    with psycopg.connect(db_url, autocommit=True) as conn:  # a constraint: Citus runs no triggers
        conn.execute(
            "ALTER TABLE dw_index_documents ADD CONSTRAINT refuse_poison CHECK (id <> 'poison') NOT VALID"
        )
    before = snapshot()
    documents = [doc("new-1", "a"), doc("c1", "changed"), doc("poison", "b"), doc("new-2", "c")]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await corpus.Upsert(pb.UpsertRequest(documents=documents))
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert snapshot() == before


async def test_an_upsert_to_a_slow_embedder_is_sent_in_calls_sized_to_fit_the_deadline(stub, fake_embedder):
    fake_embedder.query_latency_ms = (
        500.0  # a document costs ~2 s: 3 per call fit 12.5 s with 2 calls in flight
    )
    fake_embedder.embed_sizes.clear()
    documents = [doc(f"d{i}", f"knowledge article number {i}") for i in range(10)]
    response = await stub.Upsert(pb.UpsertRequest(namespace="ns", documents=documents))
    assert (response.upserted, response.embedded) == (10, 10)
    assert fake_embedder.embed_sizes == [3, 3, 3, 1]
    assert set(fake_embedder.priorities) == {"PRIORITY_BULK"}
