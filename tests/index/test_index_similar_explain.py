"""The Index's "more like this" (Query.similar_to: a stored document's own vectors) and
explained results (Query.explain), in the domain and on gRPC (REST: tests/rest/test_rest_similar_explain.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwsearch.common.errors import InvalidArgument, NotFound
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.documents import Document, Fusion, Hit, Query, StoredDocument
from dwsearch.index.reads import fuse_hits
from dwsearch.index.space import Metric, SparseEncoder, VectorSpace
from dwsearch.redaction import REDACTION_OFF
from dwsearch.v1 import index_pb2 as pb

SPACE = VectorSpace(
    "rest:similar", dense_from_embedder=False, sparse=SparseEncoder.GIVEN, dimension=2, metric=Metric.COSINE
)


@pytest.fixture
async def index(pool):
    ix = DocumentIndex(pool, None, space=SPACE, redaction=REDACTION_OFF)
    await ix.upsert(
        "ns",
        [
            Document(id="a", vector=[1.0, 0.0], sparse_vector={1: 1.0, 2: 0.5}, metadata={"k": "a"}),
            Document(id="b", vector=[0.9, 0.1], sparse_vector={1: 0.8}),
            Document(id="c", vector=[0.0, 1.0], sparse_vector={7: 1.0}),
            Document(id="d", vector=[0.7, 0.7], sparse_vector={2: 0.4}),
        ],
    )
    yield ix
    await ix.clear("ns")


async def test_similar_to_queries_by_the_documents_own_vectors_and_leaves_it_out(index):
    hits = await index.query(Query(namespace="ns", similar_to="a", top_k=3, fusion=Fusion.RRF))
    assert [h.document.id for h in hits] == ["b", "d", "c"]
    # the same as a query by a's vectors, less a itself
    by_vectors = await index.query(
        Query(namespace="ns", vector=[1.0, 0.0], sparse_vector={1: 1.0, 2: 0.5}, top_k=4)
    )
    assert [h.document.id for h in by_vectors] == ["a", "b", "d", "c"]
    dense_only = await index.query(
        Query(namespace="ns", similar_to="c", top_k=1, mode=None, fusion=Fusion.DBSF)
    )
    assert [h.document.id for h in dense_only] != ["c"]


async def test_similar_to_a_missing_document_or_with_vectors_is_refused(index):
    with pytest.raises(NotFound, match="similar_to 'zz'"):
        await index.query(Query(namespace="ns", similar_to="zz"))
    with pytest.raises(NotFound):
        await index.query(Query(namespace="other", similar_to="a"))  # another namespace's
    with pytest.raises(InvalidArgument, match="similar_to: alone"):
        await index.query(Query(namespace="ns", similar_to="a", sparse_vector={1: 1.0}))


async def test_explain_gives_each_source_and_sums_to_the_score(index):
    hits = await index.query(
        Query(namespace="ns", vector=[1.0, 0.0], sparse_vector={1: 1.0}, top_k=4, explain=True)
    )
    by_id = {h.document.id: h for h in hits}
    a = by_id["a"].explanation
    assert a is not None and [leg.source for leg in a.legs] == ["dense:rest:similar", "sparse:rest:similar"]
    assert [leg.rank for leg in a.legs] == [1, 1]
    assert a.fused_score == by_id["a"].score == pytest.approx(2 / 60)
    assert [leg.source for leg in by_id["c"].explanation.legs] == ["dense:rest:similar"]  # no shared term
    plain = await index.query(Query(namespace="ns", vector=[1.0, 0.0], top_k=2))
    assert all(h.explanation is None for h in plain)
    dense = await index.query(Query(namespace="ns", vector=[1.0, 0.0], top_k=2, explain=True))
    (leg,) = dense[0].explanation.legs
    assert leg.rank == 1 and leg.normalized == leg.score == dense[0].explanation.fused_score


sources = st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(-5, 5, allow_nan=False)), max_size=12)


@given(dense=sources, sparse=sources, algorithm=st.sampled_from([Fusion.RRF, Fusion.DBSF]))
def test_the_explanations_recompute_the_fused_scores_and_the_order_exactly(dense, sparse, algorithm):
    def hits(source):
        ordered = sorted(source, key=lambda pair: -pair[1])  # a source lists best first
        return [Hit(StoredDocument(doc_id), score) for doc_id, score in ordered]

    fused = fuse_hits(hits(dense), hits(sparse), algorithm, legs=("dense:m", "sparse:m"))
    plain = fuse_hits(hits(dense), hits(sparse), algorithm)
    assert [(h.document.id, h.score) for h in fused] == [(h.document.id, h.score) for h in plain]
    recomputed = []
    for hit in fused:
        assert hit.explanation is not None
        total = 0.0
        for leg in hit.explanation.legs:
            total += leg.weight * leg.normalized
        assert total == hit.score == hit.explanation.fused_score
        recomputed.append((-total, hit.document.id))
    assert sorted(recomputed) == recomputed


async def test_grpc_query_by_similar_to_id_with_explanations(make_stub):
    stub = await make_stub()
    await stub.Upsert(
        pb.UpsertRequest(
            namespace="kb",
            documents=[
                pb.Document(id="refund", data="how do I get a refund for a parcel"),
                pb.Document(id="refund-2", data="how do I get a refund for a parcel quickly"),
                pb.Document(id="password", data="reset my password"),
            ],
        )
    )
    response = await stub.Query(
        pb.QueryRequest(namespace="kb", similar_to_id="refund", top_k=2, explain=True)
    )
    assert [r.id for r in response.results] == ["refund-2", "password"]
    top = response.results[0]
    assert top.explanation.legs and top.explanation.fused_score == pytest.approx(top.score, rel=1e-6)
    assert {leg.leg.split(":")[0] for leg in top.explanation.legs} <= {"dense", "sparse"}
    plain = await stub.Query(pb.QueryRequest(namespace="kb", similar_to_id="refund", top_k=1))
    assert not plain.results[0].HasField("explanation")
    import grpc

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Query(pb.QueryRequest(namespace="kb", similar_to_id="nope"))
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND
