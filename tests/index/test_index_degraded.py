"""The Index degrades as chat search does when the query's embedding is late or failing
(dwsearch.retrieval.queries): a space whose sparse side is BM25 answers with that leg
alone, saying why, and so does each section of an agent context; a query or an agent
context that needs the embedding is UNAVAILABLE at the deadline. In process, over the fake
embedder on a real socket, slowed past the deadline (tests/reliability/
test_rel_frozen_embedder.py freezes a real process)."""

from __future__ import annotations

import asyncio
import time

import pytest

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.common.errors import Unavailable
from dwsearch.index.context import AgentContextBuilder, Section
from dwsearch.index.document_index import IndexParts
from dwsearch.index.documents import Document, Include, Query, QueryMode
from dwsearch.index.space import Metric, SparseEncoder, VectorSpace
from dwsearch.redaction import REDACTION_OFF
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.queries import QueryEmbedders
from dwsearch_testkit.fakes import FAKE_MODEL

DEADLINE_S = 0.2
SLACK_S = 0.5
DOCS = [
    Document(id="kb-1", data="refund for a damaged parcel", metadata={"appId": "a", "type": "knowledge"}),
    Document(id="t-1", data="parcel arrived damaged", metadata={"appId": "a", "type": "conversation"}),
    Document(id="r-1", data="your refund is on its way", metadata={"appId": "a", "type": "trusted_response",
                                                                   "trustScore": 0.9}),
]  # fmt: skip


@pytest.fixture
async def parts(pool, fake_embedder):
    client = EmbedderClient(fake_embedder.address, timeout=10)
    queries = QueryEmbedders(client, timeout=DEADLINE_S, first_model=FAKE_MODEL)
    try:
        yield IndexParts(pool, client, redaction=REDACTION_OFF, queries=queries)
    finally:
        await client.close()


async def timed(work):
    started = time.monotonic()
    result = await work
    return time.monotonic() - started, result


async def test_hybrid_over_bm25_answers_with_its_sparse_leg_when_the_embedder_is_late(parts, fake_embedder):
    index = parts.index(space=VectorSpace(FAKE_MODEL, sparse=SparseEncoder.BM25, metric=Metric.COSINE))
    await index.upsert("ns", DOCS)
    fake_embedder.delay = 5.0  # far past the deadline
    elapsed, answer = await timed(index.query_answer(Query(namespace="ns", data="damaged parcel", top_k=3)))
    assert elapsed < DEADLINE_S + SLACK_S
    assert answer.mode is QueryMode.SPARSE
    assert [reason for reason, _ in answer.degradations] == [Degradation.EMBEDDER_TIMEOUT]
    assert {hit.document.id for hit in answer.hits} == {"kb-1", "t-1"}
    # SPARSE over BM25 needs no embedder at all: whole, and at once.
    elapsed, answer = await timed(
        index.query_answer(Query(namespace="ns", data="refund", top_k=3, mode=QueryMode.SPARSE))
    )
    assert answer.degradations == [] and {hit.document.id for hit in answer.hits} == {"kb-1", "r-1"}
    assert elapsed < SLACK_S


async def test_a_query_that_needs_the_embedder_is_unavailable_at_the_deadline(parts, fake_embedder):
    index = parts.index(model=FAKE_MODEL)
    await index.upsert("ns", DOCS)
    fake_embedder.delay = 5.0
    for mode in (None, QueryMode.DENSE, QueryMode.HYBRID):
        started = time.monotonic()
        with pytest.raises(Unavailable, match="needs the embedder"):
            await index.query_answer(
                Query(namespace="ns", data=f"where is my parcel {mode}", top_k=3, mode=mode)
            )
        assert time.monotonic() - started < DEADLINE_S + SLACK_S
    bm25 = parts.index(space=VectorSpace(FAKE_MODEL, sparse=SparseEncoder.BM25, metric=Metric.COSINE))
    with pytest.raises(Unavailable):  # DENSE asked of a BM25 space: no leg it asked for answers
        await bm25.query_answer(Query(namespace="ns", data="refund again", top_k=3, mode=QueryMode.DENSE))


async def test_agent_context_answers_with_what_each_section_could_get(parts, fake_embedder):
    bm25 = parts.index(space=VectorSpace(FAKE_MODEL, sparse=SparseEncoder.BM25, metric=Metric.COSINE))
    model = parts.index(model=FAKE_MODEL)
    # Two spaces of one model: namespaces of their own (a REST index's are its own too).
    await bm25.upsert("bm25", DOCS)
    await model.upsert("model", DOCS)
    fake_embedder.delay = 5.0
    elapsed, context = await timed(
        AgentContextBuilder(bm25, None, rerank_timeout=1).build("bm25", "damaged parcel", "a")
    )
    assert elapsed < DEADLINE_S + SLACK_S
    assert [reason for reason, _ in context.degradations] == [Degradation.EMBEDDER_TIMEOUT]
    assert [h.document.id for h in context.sections[Section.KNOWLEDGE]] == ["kb-1"]
    # Every leg of the model's own space needs the embedding: UNAVAILABLE, at the deadline.
    started = time.monotonic()
    with pytest.raises(Unavailable, match="agent context needs the embedder"):
        await AgentContextBuilder(model, None, rerank_timeout=1).build("model", "damaged box", "a")
    assert time.monotonic() - started < DEADLINE_S + SLACK_S


async def test_search_and_every_index_share_one_query_embedder_per_model(parts, fake_embedder):
    """One QueryEmbedder per model: the same deadline, breaker, Info and cache whoever asks."""
    queries = parts.queries
    assert queries is not None
    first = parts.index(model=FAKE_MODEL)
    bm25 = parts.index(space=VectorSpace(FAKE_MODEL, sparse=SparseEncoder.BM25, metric=Metric.COSINE))
    assert first.queries is bm25.queries is queries.for_model(FAKE_MODEL)
    assert first.queries.timeout == DEADLINE_S and first.queries.breaker is not None
    assert first.queries.breaker.name == "embedder"
    other = queries.for_model("other/model")
    assert other.breaker is not None and other.breaker.name == "embedder:other/model"
    assert other is queries.for_model("other/model") and other.cache is first.queries.cache


async def test_a_write_fails_at_once_while_the_models_circuit_is_open_and_goes_on_when_it_closes(
    pool, fake_embedder
):
    """Found by the soak (bench.soak): with the embedder frozen, every REST upsert waited
    out its Info's 10 s (then the bulk call's 25 s) while queries answered in 300 ms. A
    write has nothing to degrade to, but it goes through the model's breaker: once queries
    have opened it, an upsert answers UNAVAILABLE at once and writes nothing; when the
    breaker's trial succeeds, writes go on."""
    from dwsearch.clients.breaker import CircuitBreaker, CircuitOpen

    client = EmbedderClient(fake_embedder.address, timeout=10)
    breaker = CircuitBreaker("embedder", cooldown_s=0.5)
    queries = QueryEmbedders(client, timeout=DEADLINE_S, first_model=FAKE_MODEL, first_breaker=breaker)
    try:
        index = IndexParts(pool, client, redaction=REDACTION_OFF, queries=queries).index(
            space=VectorSpace(FAKE_MODEL, sparse=SparseEncoder.BM25, metric=Metric.COSINE)
        )
        await index.upsert("ns", DOCS[:1])
        fake_embedder.delay = 30.0  # frozen, as far as any deadline here goes
        for attempt in range(3):  # three late queries in a row open the circuit
            await index.query_answer(Query(namespace="ns", data=f"late query {attempt}", top_k=1))
        calls = fake_embedder.calls
        elapsed, raised = await timed(_raises(index.upsert("ns", DOCS[1:])))
        assert isinstance(raised, CircuitOpen) and elapsed < SLACK_S
        assert fake_embedder.calls == calls  # not called
        assert await stored_ids(index) == {"kb-1"}  # nothing written

        fake_embedder.delay = 0.0  # thawed: after the cooldown the next call is the trial
        await asyncio.sleep(0.6)
        await index.upsert("ns", DOCS[1:])
        assert await stored_ids(index) == {"kb-1", "t-1", "r-1"}
    finally:
        await client.close()


async def _raises(work):
    try:
        await work
    except Exception as exc:
        return exc
    return None


async def stored_ids(index) -> set[str]:
    found, _ = await index.fetch("ns", [d.id for d in DOCS], Include())
    return {d.id for d in found}


async def test_a_write_waits_at_most_the_info_deadline_for_an_embedder_that_answers_nothing(
    parts, fake_embedder
):
    """Before the breaker opens (the first writes of a freeze, or the breaker's trial), a
    write's fresh Info waits INFO_TIMEOUT_S (2 s; it was 10 s, found by the soak), then
    fails with nothing written."""
    from dwsearch.common.errors import DeadlineExceeded
    from dwsearch.index.base import INFO_TIMEOUT_S

    index = parts.index(space=VectorSpace(FAKE_MODEL, sparse=SparseEncoder.BM25, metric=Metric.COSINE))
    fake_embedder.info_delay = 30.0
    elapsed, raised = await timed(_raises(index.upsert("ns", DOCS)))
    assert isinstance(raised, (DeadlineExceeded, Unavailable)), raised
    assert INFO_TIMEOUT_S - 0.1 < elapsed < INFO_TIMEOUT_S + SLACK_S
    assert await stored_ids(index) == set()
