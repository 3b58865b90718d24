"""Every statement dwsearch issues touches one org_id hash partition (docs/scaling.md):
the property that makes each of them a single-shard router query once the tables are
distributed by org_id with Citus, checked without Citus.

A representative workload runs through the real code (sweeps, sweep admin, every Search
mode, IndexService with agent context and knowledge gaps) against the normal migrated
schema, recording every statement. Each distinct one is then planned (EXPLAIN, with its
parameters) against a clone of the schema whose tables are hash-partitioned by their
distribution column (tests/support/partition_check.py): a plan may touch at most one
partition of each partitioned table (a partition pruned at plan time is absent from the
plan; one pruned at executor start is counted in "Subplans Removed" and absent too), and
an INSERT into one must give every row the same constant partition key.

Statements cross-org by nature are in ALLOWED, each with its reason; each must still be
issued by the workload, so the list stays true.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import grpc
import psycopg
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from partition_check import (
    EXPLAINABLE,
    UTILITY,
    Recorder,
    Statement,
    build_partitioned_clone,
    column_positions,
    explain,
    install,
    partition_parents,
    task_counts,
    touched,
)
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.db.pool import open_pool
from dwsearch.flags import KNOWLEDGE_GAPS_FLAG
from dwsearch.index import service as index_service
from dwsearch.index.context import AgentContextBuilder
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.gaps import KnowledgeGaps
from dwsearch.index.service import IndexService, to_struct
from dwsearch.redaction import REDACTION_ON
from dwsearch.search import service as search_service
from dwsearch.search.knnindex import OrgKnnIndexes
from dwsearch.search.searcher import Searcher
from dwsearch.search.service import SearchService
from dwsearch.search.settings import SearchSettings
from dwsearch.sweep.admin import SweepAdmin
from dwsearch.sweep.sweeper import Sweeper, SweepOptions
from dwsearch.v1 import index_pb2 as ipb
from dwsearch.v1 import index_pb2_grpc, search_pb2_grpc
from dwsearch.v1 import search_pb2 as spb
from dwsearch_testkit.cluster import ON_CLUSTER, one_node_only
from dwsearch_testkit.fakes import FAKE_MODEL, FakeReranker
from dwsearch_testkit.seed import T0, enable_semantic_search, insert_events, set_org_flag

ORGS = ("org-a", "org-b", "org-c")
LATER = T0 + timedelta(days=30)

# Statements cross-org by nature, allowed to touch several partitions (multi-shard under
# Citus): {regular expression searched in the statement, whitespace collapsed: the reason}.
# Each must match a statement the workload issues, so the list stays true.
ALLOWED: dict[str, str] = {
    # --- the sweep over the deployment (a batch job: one per sweep, not per request)
    r"WITH RECURSIVE orgs\(org_id, n\) AS \( \(SELECT org_id, 1 FROM dw_chat_events": (
        "flags.orgs_with_events: the sweep reports every org with events whose flags are off"
    ),
    r"WITH RECURSIVE windowed \(org_id\) AS": (
        "sweep discovery (sweep.store.discovery): the orgs with windows, for the full check's rotation"
    ),
    r"^SELECT w\.org_id, w\.provider, w\.external_channel_id, w\.last_event_time, w\.last_event_id, "
    r"cardinality\(last_window\.source_message_ids\) FROM dw_sweep_watermarks w .* WHERE w\.model = %\(model\)s "
    r"AND w\.org_id = ANY\(%\(orgs\)s\)$": (
        "keys.pending_keys's watermarks of a batch of orgs, with their last windows: the sweep's key discovery"
    ),
    r"GROUP BY org_id, provider, external_channel_id HAVING bool_or\(after_watermark OR unledgered\)": (
        "keys.pending_keys over a batch of orgs (e.org_id = ANY(orgs)): the sweep's key discovery"
    ),
    r"^SELECT DISTINCT w\.id, w\.org_id FROM dw_sweep_windows AS w .* AND w\.org_id = ANY\(%\(orgs\)s::varchar\[\]\)"
    r" AND l\.org_id = ANY\(%\(orgs\)s::varchar\[\]\)$": (
        "retention.drop_stale_windows over a batch of orgs: the sweep's full check (deletions go org by org)"
    ),
    r"^SELECT count\(\*\), min\(checked_at\) FROM dw_sweep_org_checks WHERE org_id = ANY\(%\(orgs\)s": (
        "discovery: when each org of the sweep's orgs was last fully checked, one statement for them all"
    ),
    r"^INSERT INTO dw_sweep_org_checks \(org_id, checked_at\) SELECT unnest\(%\(orgs\)s": (
        "discovery: the batch of orgs just fully checked, one statement for the batch"
    ),
    # --- whole-deployment status (SweepService.Status without an org: an admin read)
    r"FROM dw_sweep_watermarks w CROSS JOIN LATERAL .* WHERE w\.model = %\(model\)s ORDER BY w\.org_id": (
        "status.watermarks of every org"
    ),
    r"^WITH k AS MATERIALIZED .* SELECT count\(\*\), min\(e\.created_at\) FROM k JOIN dw_chat_events e": (
        "status.unwatermarked_pending of every enabled org"
    ),
    r"FROM dw_sweep_windows WHERE status = %\(poison\)s AND model = %\(model\)s ORDER BY org_id": (
        "status.poison_windows of every org"
    ),
    r"^SELECT count\(\*\) FROM dw_message_embeddings WHERE model = %\(model\)s$": (
        "status.embedded_windows of every org"
    ),
    # --- the index's Info (every namespace's count, by nature)
    r'^SELECT namespace, count\(\*\) FROM "dw_index_documents" WHERE model = %s GROUP BY namespace': (
        "IndexService.Info / REST info: the document count of every namespace"
    ),
}

# The same on a Citus cluster, where the skip scans are written as DISTINCT
# (dwsearch.db.distributed); every other entry is the same statement.
CLUSTER_FORMS = {
    r"WITH RECURSIVE orgs\(org_id, n\) AS \( \(SELECT org_id, 1 FROM dw_chat_events": (
        r"^SELECT DISTINCT org_id FROM dw_chat_events ORDER BY org_id LIMIT"
    ),
    r"WITH RECURSIVE windowed \(org_id\) AS": r"WITH windowed \(org_id\) AS \(SELECT DISTINCT org_id FROM dw_sweep_windows\)",
}
CLUSTER_ALLOWED = {CLUSTER_FORMS.get(pattern, pattern): why for pattern, why in ALLOWED.items()}

# Request-path statements that could name their org but do not yet: each must still be
# issued and still touch several partitions (remove the entry when it is fixed).
PENDING: dict[str, str] = {}


def _flat(text: str) -> str:
    return " ".join(text.split())


def matching(patterns: dict[str, str], text: str) -> str | None:
    flat = _flat(text)
    return next((p for p in patterns if re.search(p, flat)), None)


def _ts(value) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def doc(doc_id: str, data: str, **metadata) -> ipb.Document:
    return ipb.Document(id=doc_id, data=data, metadata=to_struct(metadata))


async def _serve(add, service) -> tuple[GrpcHost, grpc.aio.Channel]:
    host = GrpcHost("127.0.0.1:0", [add(service)])
    port = await host.start()
    await host.set_serving(True)
    return host, grpc.aio.insecure_channel(f"127.0.0.1:{port}")


async def _sweep(sweeper: Sweeper, **options) -> None:
    last = None
    async for progress in sweeper.sweep(SweepOptions(**options)):
        last = progress
    assert last is not None and last.done


async def run_workload(url: str, embedder_address: str, recorder: Recorder) -> None:
    enable_semantic_search(url, *ORGS)
    set_org_flag(url, "shop", KNOWLEDGE_GAPS_FLAG, True)
    ids: dict[tuple[str, str], list[str]] = {}
    for org in ORGS:
        for channel in ("ch-1", "ch-2"):
            texts = [f"{org} {channel} parcel refund question {i} about delivery" for i in range(4)]
            rows = [(org, "whatsapp", channel, t, T0 + timedelta(minutes=i)) for i, t in enumerate(texts)]
            ids[(org, channel)] = insert_events(url, rows)

    reranker = FakeReranker()
    await reranker.start()
    pool = await open_pool(url, max_size=6)
    embedder = EmbedderClient(embedder_address, timeout=10)
    rerank_client = RerankerClient(reranker.address, timeout=5)
    clock = [LATER]
    hosts, channels = [], []
    try:
        sweeper = Sweeper(pool, embedder, model=FAKE_MODEL, clock=lambda: clock[0], redaction=REDACTION_ON)
        admin = SweepAdmin(pool, model=FAKE_MODEL, clock=lambda: clock[0])
        searcher = Searcher(
            pool,
            embedder,
            rerank_client,
            # Hybrid's lexical leg on (DWSEARCH_LEXICAL_LEG): its statements are checked too.
            SearchSettings(models=(FAKE_MODEL,), embed_timeout=10, rerank_timeout=10, lexical=True),
            knn_indexes=OrgKnnIndexes(),  # as serve runs it (DWSEARCH_KNN_INDEX=auto)
        )
        index = DocumentIndex(pool, embedder, model=FAKE_MODEL)
        gaps = KnowledgeGaps(index, threshold=2.0, clock=lambda: clock[0], flag_ttl=0)
        index_svc = IndexService(
            index, AgentContextBuilder(index, rerank_client, rerank_timeout=5, gaps=gaps), gaps
        )
        search_host, search_channel = await _serve(
            lambda svc: Service(
                search_service.SERVICE_NAME,
                lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(svc, s),
            ),
            SearchService(searcher),
        )
        index_host, index_channel = await _serve(
            lambda svc: Service(
                index_service.SERVICE_NAME,
                lambda s: index_pb2_grpc.add_IndexServiceServicer_to_server(svc, s),
            ),
            index_svc,
        )
        hosts += [search_host, index_host]
        channels += [search_channel, index_channel]
        search = search_pb2_grpc.SearchServiceStub(search_channel)
        stub = index_pb2_grpc.IndexServiceStub(index_channel)

        with recorder.recording():
            # --- the sweep: a backfill over every org, a no-op sweep, one org's sweep
            await _sweep(sweeper)
            await _sweep(sweeper)
            await _sweep(sweeper, org_id="org-a")
        # An edit, a deletion and new messages: the next sweep drops stale windows and
        # windows the new events next to the last window.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "UPDATE dw_chat_events SET message_text = 'edited parcel text' WHERE id = %s",
                (ids[("org-a", "ch-1")][0],),
            )
            conn.execute("DELETE FROM dw_chat_events WHERE id = %s", (ids[("org-b", "ch-1")][0],))
            # Windows as embedded before the lexical leg: the next sweep backfills their weights.
            conn.execute("UPDATE dw_message_embeddings SET lexical = NULL WHERE org_id = 'org-b'")
            conn.execute("DELETE FROM dw_lexical_windows WHERE org_id = 'org-b'")
            # Windows weighed by an older term extraction (migration 0021): the backfill weighs
            # them again, org-a's to the same weights (only their version written), org-c's
            # to new ones.
            conn.execute("UPDATE dw_message_embeddings SET lexical_terms = NULL WHERE org_id = 'org-a'")
            conn.execute(
                """UPDATE dw_message_embeddings SET lexical = '{1:1}/1000000000', lexical_terms = NULL
                   WHERE org_id = 'org-c'"""
            )
        insert_events(url, [("org-a", "whatsapp", "ch-2", "a late parcel", T0 + timedelta(minutes=30))])
        with recorder.recording():
            await _sweep(sweeper)
            # --- sweep admin
            await admin.status()
            await admin.status("org-a")
            await admin.forget("org-b", [ids[("org-b", "ch-2")][1]])
            await admin.retry_poison("org-a")
            await admin.retry_poison("org-a", [str(uuid.uuid4())])
            await admin.purge("org-c", T0 + timedelta(minutes=2))

            # --- Search, every mode
            base = dict(org_id="org-a", query="parcel refund", limit=5)
            for mode in (spb.SEARCH_MODE_HYBRID, spb.SEARCH_MODE_FTS, spb.SEARCH_MODE_SEMANTIC):
                await search.Search(spb.SearchRequest(**base, mode=mode), timeout=10)
                await search.Search(
                    spb.SearchRequest(**base, mode=mode, explain=True, context_messages=2), timeout=10
                )
                await search.Search(
                    spb.SearchRequest(
                        **base,
                        mode=mode,
                        provider="whatsapp",
                        external_channel_id="ch-2",
                        start_time=_ts(T0),
                        end_time=_ts(T0 + timedelta(hours=1)),
                        sort=spb.SEARCH_SORT_NEWEST,
                    ),
                    timeout=10,
                )
            await search.Search(
                spb.SearchRequest(**base, rerank=True, fusion=spb.SEARCH_FUSION_WEIGHTED), timeout=10
            )
            await search.Search(
                spb.SearchRequest(**base, rerank=False, fusion=spb.SEARCH_FUSION_RRF), timeout=10
            )
            # A word in one of org-a's windows ("a late parcel"): the lexical leg reads the
            # windows holding it through the index of the org's terms (its by-term statement).
            await search.Search(spb.SearchRequest(org_id="org-a", query="late", limit=5), timeout=10)
            await search.Similar(
                spb.SimilarRequest(org_id="org-a", message_id=ids[("org-a", "ch-2")][1]), timeout=10
            )
            with psycopg.connect(url) as conn:
                (window_id,) = conn.execute(
                    "SELECT id::text FROM dw_message_embeddings WHERE org_id = 'org-a' LIMIT 1"
                ).fetchone()
            await search.Similar(
                spb.SimilarRequest(org_id="org-a", window_id=window_id, context_messages=2, explain=True),
                timeout=10,
            )
            await search.Similar(
                spb.SimilarRequest(
                    org_id="org-a",
                    conversation=spb.Conversation(
                        provider="whatsapp",
                        external_channel_id="ch-1",
                        start_time=_ts(T0),
                        end_time=_ts(T0 + timedelta(hours=1)),
                    ),
                ),
                timeout=10,
            )

            # --- IndexService
            shop = [
                doc("k-refund", "how refunds work", type="knowledge", appId="shop"),
                doc("k-parcel", "where parcels go", type="knowledge", appId="shop"),
                doc("t-late", "my parcel is late", type="conversation", appId="shop", resolution="refund"),
                doc("r-good", "sorry, here is your refund", type="response", appId="shop", trustScore=0.9),
            ]
            await stub.Upsert(ipb.UpsertRequest(namespace="support", documents=shop))
            await stub.Upsert(
                ipb.UpsertRequest(
                    namespace="other", documents=[doc("x", "another tenant", type="knowledge", appId="o")]
                )
            )
            await stub.Update(
                ipb.UpdateRequest(
                    namespace="support",
                    id="k-refund",
                    metadata=to_struct({"source": "faq"}),
                    data="refunds: how",
                )
            )
            for mode in (ipb.QUERY_MODE_DENSE, ipb.QUERY_MODE_SPARSE, ipb.QUERY_MODE_HYBRID):
                await stub.Query(
                    ipb.QueryRequest(
                        namespace="support",
                        data="refund",
                        top_k=3,
                        mode=mode,
                        filter="appId = 'shop' AND type = 'knowledge'",
                        include_data=True,
                        include_metadata=True,
                        include_vectors=True,
                        explain=True,
                    )
                )
            await stub.Query(ipb.QueryRequest(namespace="support", similar_to_id="t-late", top_k=2))
            await stub.Fetch(
                ipb.FetchRequest(namespace="support", ids=["k-refund", "nope"], include_metadata=True)
            )
            await stub.Range(ipb.RangeRequest(namespace="support", limit=2, include_data=True))
            await stub.Range(ipb.RangeRequest(namespace="support", limit=2, prefix="k-"))
            await stub.Info(ipb.IndexServiceInfoRequest())
            for rerank in (False, True):
                await stub.BuildAgentContext(
                    ipb.BuildAgentContextRequest(
                        namespace="support", message="where is my parcel?", app_id="shop", rerank=rerank
                    )
                )
            await gaps.drain()
            listing = await stub.ListKnowledgeGaps(ipb.ListKnowledgeGapsRequest(org_id="shop"))
            gap_ids = [g for group in listing.groups for g in group.gap_ids]
            await stub.ForgetKnowledgeGaps(ipb.ForgetKnowledgeGapsRequest(org_id="shop", ids=gap_ids[:1]))
            await stub.ForgetKnowledgeGaps(ipb.ForgetKnowledgeGapsRequest(org_id="shop", all=True))
            await stub.Delete(ipb.DeleteRequest(namespace="support", ids=ipb.IdList(ids=["r-good"])))
            await stub.Delete(ipb.DeleteRequest(namespace="support", prefix="t-"))
            await stub.Delete(ipb.DeleteRequest(namespace="support", filter="appId = 'shop'"))
    finally:
        for channel in channels:
            await channel.close()
        for host in hosts:
            await host.stop(0)
        await embedder.close()
        await rerank_client.close()
        await pool.close()
        await reranker.stop()


def _clone_url(url: str, schema: str, source: str) -> str:
    """The clone's tables first; then the source schema, whose functions the clone's
    indexes and the statements name (migration 0019's dw_lexical_term_keys): the clone
    holds every table, so only what is not a table resolves there."""
    params = conninfo_to_dict(url)
    params["options"] = f"-c search_path={schema},{source},public"
    return make_conninfo(**params)


@dataclass
class Clone:
    url: str
    layout: dict[str, str | None]
    parents: dict[str, str]
    positions: dict[tuple[str, str], int]

    def connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.url, autocommit=True)
        register_vector(conn)
        return conn


@pytest.fixture
def clone(db_url) -> Iterator[Clone]:
    """The migrated schema's hash-partitioned clone, in a schema of its own."""
    source = conninfo_to_dict(db_url)["options"].split("search_path=")[1].split(",")[0]
    target = f"{source}_parts"
    with psycopg.connect(db_url, autocommit=True) as conn:
        layout = build_partitioned_clone(conn, source, target)
        parents = partition_parents(conn, target)
        positions = column_positions(conn, target)
    try:
        yield Clone(_clone_url(db_url, target, source), layout, parents, positions)
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(target)))


@one_node_only("on a cluster, test_every_statement_is_routed_to_one_shard checks Citus's own plans")
def test_the_clone_is_partitioned_by_org_and_namespace(clone):
    assert clone.layout["dw_sweep_window_events"] == "org_id"
    assert clone.layout["dw_index_documents"] == "namespace"
    assert clone.layout["org_feature_flags"] is None
    assert {t for t, c in clone.layout.items() if c} == set(clone.parents.values())


@one_node_only("on a cluster, test_every_statement_is_routed_to_one_shard checks Citus's own plans")
async def test_every_statement_touches_one_partition(db_url, fake_embedder, monkeypatch, clone):
    recorder = Recorder()
    install(monkeypatch, recorder)
    await run_workload(db_url, fake_embedder.address, recorder)
    statements = recorder.unique()
    assert len(statements) > 50, "the workload recorded too little"
    assert any("dw_lexical_term_keys" in s.text for s in statements), "the lexical leg's by-term statement"
    assert any("lexical_terms = " in s.text and "SET lexical = " in s.text for s in statements) and any(
        "SET lexical_terms = " in s.text for s in statements
    ), "the backfill's statements weighing windows again"

    violations, used, unplanned = [], set(), []
    still_wide: set[str] = set()
    with clone.connect() as conn:
        for statement in statements:
            fragment = matching(ALLOWED, statement.text)
            if fragment is not None:
                used.add(fragment)
                continue
            if UTILITY.match(statement.text):
                continue
            if not EXPLAINABLE.match(statement.text):
                unplanned.append(_flat(statement.text)[:200])
                continue
            try:
                with conn.transaction():
                    plans = explain(conn, statement)
            except psycopg.Error as exc:
                violations.append(f"{exc.__class__.__name__}: {exc}\n    {_flat(statement.text)[:400]}")
                continue
            seen = touched(plans, clone.parents, clone.layout, clone.positions)
            pending = matching(PENDING, statement.text)
            if pending is not None:
                if seen.spread():
                    still_wide.add(pending)
                continue
            if wide := seen.spread():
                violations.append(
                    f"{wide}\n    {_flat(statement.text)[:400]}\n    params {statement.params!r:.300}"
                )
    assert unplanned == [], "statements neither planned nor allowed (DDL?):\n" + "\n".join(unplanned)
    assert violations == [], f"{len(violations)} statements touch several partitions:\n" + "\n".join(
        violations
    )
    assert used == set(ALLOWED), f"allowed statements the workload no longer issues: {set(ALLOWED) - used}"
    assert still_wide == set(PENDING), (
        f"PENDING entries now single-partition or no longer issued (remove them): {set(PENDING) - still_wide}"
    )


@pytest.mark.parametrize(
    ("query", "params", "wide"),
    [
        ("SELECT count(*) FROM dw_sweep_windows WHERE org_id = %s", ["org-a"], {}),
        ("SELECT count(*) FROM dw_sweep_windows", None, {"dw_sweep_windows": 4}),
        (
            """SELECT l.event_id FROM dw_sweep_window_events l JOIN dw_sweep_windows w ON w.id = l.window_id
               WHERE l.org_id = %s""",
            ["org-a"],
            {"dw_sweep_windows": 4},
        ),
        (
            "DELETE FROM dw_message_embeddings WHERE id = ANY(%s)",
            [[uuid.uuid4()]],
            {"dw_message_embeddings": 4},
        ),
        ("UPDATE dw_sweep_watermarks SET last_error = 'x' WHERE org_id = %s", ["org-a"], {}),
        ("INSERT INTO dw_sweep_retention (org_id, cutoff) VALUES (%s, now())", ["org-a"], {}),
        (
            "INSERT INTO dw_sweep_retention (org_id, cutoff) SELECT o, now() FROM unnest(%s::text[]) AS o",
            [["org-a", "org-b"]],
            {"dw_sweep_retention": 4},
        ),
        ("SELECT * FROM dw_index_documents WHERE namespace = %s AND model = %s", ["support", "m"], {}),
    ],
)
@one_node_only("the partitioned clone is one node's")
def test_the_check_sees_a_statement_spread_over_partitions(clone, query, params, wide):
    """The checker itself: a statement without the distribution column (or joining
    without it) is seen touching every partition; one naming it, one."""
    with clone.connect() as conn:
        seen = touched(explain(conn, Statement(query, params)), clone.parents, clone.layout, clone.positions)
    assert seen.spread() == wide


@pytest.mark.skipif(
    not ON_CLUSTER, reason="Citus's plans: with DWSEARCH_TEST_CITUS_WORKERS (make test runs it)"
)
async def test_every_statement_is_routed_to_one_shard(db_url, fake_embedder, monkeypatch):
    """The same workload on a Citus cluster, each distinct statement planned there by Citus
    itself: every distributed query and subplan of a request-path statement is one task
    (a router plan on one shard); the cross-org ones are CLUSTER_ALLOWED, the list above."""
    recorder = Recorder()
    install(monkeypatch, recorder)
    await run_workload(db_url, fake_embedder.address, recorder)
    statements = recorder.unique()
    assert len(statements) > 50, "the workload recorded too little"
    assert any("dw_lexical_term_keys" in s.text for s in statements), "the lexical leg's by-term statement"
    assert any("lexical_terms = " in s.text and "SET lexical = " in s.text for s in statements) and any(
        "SET lexical_terms = " in s.text for s in statements
    ), "the backfill's statements weighing windows again"
    violations, used, planned = [], set(), 0
    with psycopg.connect(db_url, autocommit=True) as conn:
        register_vector(conn)
        for statement in statements:
            fragment = matching(CLUSTER_ALLOWED, statement.text)
            if fragment is not None:
                used.add(fragment)
                continue
            if UTILITY.match(statement.text) or not EXPLAINABLE.match(statement.text):
                continue
            # With its parameters as literals: Citus plans no INSERT ... SELECT whose
            # parameters are unbound, as EXPLAIN leaves them (it runs them bound).
            literal = Statement(psycopg.ClientCursor(conn).mogrify(statement.text, statement.params), None)
            try:
                with conn.transaction():
                    counts = task_counts(explain(conn, literal))
            except psycopg.Error as exc:
                violations.append(f"{exc.__class__.__name__}: {exc}\n    {_flat(statement.text)[:400]}")
                continue
            planned += bool(counts)
            if any(n > 1 for n in counts):
                violations.append(f"tasks {counts}\n    {_flat(statement.text)[:400]}")
    assert planned > 40, "too few distributed statements: is the schema distributed?"
    assert violations == [], f"{len(violations)} statements run on several shards:\n" + "\n".join(violations)
    assert used == set(CLUSTER_ALLOWED), f"allowed statements no longer issued: {set(CLUSTER_ALLOWED) - used}"
