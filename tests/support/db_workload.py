"""A serve-like workload through the real code paths (sweep, search, index upsert and
query, a REST index's writes and Range), for the database-role and pgbouncer tests: the events and flags are written
through `admin_url` (as the Go module would), everything dwsearch does through `pool`."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool
from sweep_harness import ORG, T0, Harness, SweepFakeEmbedder

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.index.document_index import DocumentIndex, IndexParts
from dwsearch.index.documents import SCOPED_NAMESPACE_SEPARATOR, Document, Include, Query
from dwsearch.index.space import Metric, SparseEncoder, VectorSpace
from dwsearch.search.query import SearchQuery
from dwsearch.search.searcher import Searcher
from dwsearch.search.settings import SearchSettings
from dwsearch_testkit.fakes import FAKE_MODEL
from dwsearch_testkit.seed import enable_semantic_search


def with_params(url: str, **params: str) -> str:
    merged = conninfo_to_dict(url)
    merged.update(params)
    return make_conninfo(**merged)


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database on the test server (no extensions); dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def chat(n: int, start: float = 0, tag: str = "m") -> list[tuple[float, str]]:
    """n substantial messages a minute apart."""
    return [(start + i, f"{tag} message number {i} about the invoice") for i in range(n)]


async def run_workload(admin_url: str, pool: AsyncConnectionPool, fake: SweepFakeEmbedder) -> None:
    """Sweep twice (the second finds nothing), purge nothing, search, upsert documents and
    query them; assert each worked."""
    enable_semantic_search(admin_url, ORG)
    client = EmbedderClient(fake.address, timeout=10)
    try:
        harness = Harness(admin_url, pool, client, fake)
        for c in range(3):
            harness.insert(f"c{c}", [m for s in range(2) for m in chat(3, start=60 * s, tag=f"c{c}s{s}")])
        progress = await harness.sweep()
        assert progress.keys_stalled == 0 and progress.windows_embedded == 6, progress
        assert set(harness.embedded()) == await harness.expected()
        again = await harness.sweep()
        assert (again.windows_finished, again.keys_stalled) == (0, 0), again
        status = await harness.admin().status(ORG)
        assert status.watermarks
        await harness.admin().purge(ORG, T0 - timedelta(days=1))  # the retention lock; deletes nothing
        assert set(harness.embedded()) == await harness.expected()

        searcher = Searcher(
            pool, client, None, SearchSettings(models=(FAKE_MODEL,), embed_timeout=10, rerank_timeout=10)
        )
        for _ in range(8):  # past psycopg's prepare threshold (5): a prepared statement would be reused
            result = await searcher.search(SearchQuery(ORG, "invoice"))
            assert result.hits and result.degradations == [], result.degradations

        index = DocumentIndex(pool, client, model=FAKE_MODEL)
        for i in range(8):
            await index.upsert(
                "ns",
                [
                    Document(
                        f"k{i}", f"how refunds work for broken item {i}", {"type": "knowledge", "appId": "a1"}
                    ),
                    Document("r1", "we have refunded your order", {"type": "response", "appId": "a1"}),
                ],
            )
        hits = await index.query(Query(namespace="ns", data="refunds for broken items", top_k=20))
        assert {h.document.id for h in hits} == {*(f"k{i}" for i in range(8)), "r1"}

        # A REST index's: its namespace's places (store.take_places), Range, reset, delete.
        space = VectorSpace("upstash:docs", dense_from_embedder=False, sparse=SparseEncoder.NONE, dimension=2,
                            metric=Metric.COSINE)  # fmt: skip
        rest, scoped = IndexParts(pool).index(space=space), f"docs{SCOPED_NAMESPACE_SEPARATOR}ns"
        for i in range(3):
            await rest.upsert(scoped, [Document(f"v{i}", vector=[1.0, float(i)])])
        page = await rest.range(scoped, include=Include(), limit=2)
        assert [d.id for d in page.documents] == ["v0", "v1"] and page.next_cursor == "2"
        await rest.clear(scoped)
        await rest.drop_namespace(scoped)
    finally:
        await client.close()
