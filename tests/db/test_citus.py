"""A local Citus cluster from the embedded PostgreSQL's binaries (dwsearch.db.citus): built
once from the vendored source into the cache, a coordinator and two workers on loopback,
dwsearch's migrations on the coordinator, and a per-org statement routed to one shard."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dwsearch.db import citus
from dwsearch.db.migrate import migrate, migrations
from dwsearch.sweep.store.lexical import window_lexical
from dwsearch_testkit.cluster import citus_source

pytestmark = pytest.mark.slow


SOURCE = citus_source()  # None where there is none; under CI its absence fails here
needs_source = pytest.mark.skipif(
    SOURCE is None, reason="no Citus source here (DWSEARCH_CITUS_SOURCE or shared/vendor/citus-*.tar.gz)"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[citus.CitusCluster]:
    with citus.local_cluster(workers=2, source=SOURCE) as started:
        yield started


def test_no_source_says_what_to_do_in_one_line(monkeypatch, tmp_path):
    with pytest.raises(citus.CitusUnavailable, match="no such file"):
        citus.find_source(str(tmp_path / "missing.tar.gz"))
    # A start and a checkout with no shared/ above them (tmp_path's parents may hold one: a
    # checkout's shared/ copied to /tmp beside a clone there).
    nowhere = Path("/nonexistent-dwsearch-root")
    monkeypatch.setattr(citus, "__file__", str(nowhere / "a" / "b" / "c" / "citus.py"))
    with pytest.raises(citus.CitusUnavailable) as raised:
        citus.find_source(start=nowhere / "cwd")
    message = str(raised.value)
    assert "\n" not in message and "DWSEARCH_CITUS_SOURCE" in message and "DWSEARCH_DATABASE_URL" in message


@needs_source
def test_the_build_is_cached_by_source_and_postgres_version():
    first = citus.build(SOURCE)
    started = time.monotonic()
    again = citus.build(SOURCE)
    assert again.root == first.root and time.monotonic() - started < 5  # reused, not rebuilt
    assert (first.bin / "postgres").exists()
    assert (first.install / "lib" / "postgresql" / "citus.so").exists()
    assert first.root.name.endswith(f"-pg{citus._pgserver_dirs()[2]}")


@needs_source
def test_two_workers_join_the_coordinator(cluster):
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        nodes = conn.execute(
            "SELECT nodeport FROM pg_dist_node WHERE noderole = 'primary' AND isactive ORDER BY nodeport"
        ).fetchall()
        assert sorted(port for (port,) in nodes) == sorted(cluster.ports)  # the coordinator too
        (version,) = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'citus'").fetchone()
        assert version.startswith("14.")


@needs_source
def test_migrations_run_on_the_coordinator_and_again_change_nothing(cluster):
    applied = migrate(cluster.coordinator_url, dev_schema=True)
    assert applied
    assert migrate(cluster.coordinator_url, dev_schema=True) == []


ORG_TABLES = {
    "dw_chat_events", "dw_sweep_windows", "dw_sweep_window_events", "dw_message_embeddings",
    "dw_sweep_watermarks", "dw_sweep_key_leases", "dw_sweep_retention", "dw_sweep_org_checks",
    "dw_knowledge_gaps", "dw_knn_indexes", "dw_lexical_terms", "dw_lexical_windows",
}  # fmt: skip


@needs_source
def test_the_migrations_distribute_every_table_as_docs_scaling_says(cluster):
    migrate(cluster.coordinator_url, dev_schema=True)
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        rows = conn.execute(
            """SELECT logicalrelid::text, partmethod, column_to_column_name(logicalrelid, partkey), colocationid
               FROM pg_dist_partition"""
        ).fetchall()
    tables = {name: (method, column, group) for name, method, column, group in rows}
    org_groups = {tables[name][2] for name in ORG_TABLES}
    assert all(tables[name][:2] == ("h", "org_id") for name in ORG_TABLES), tables
    assert len(org_groups) == 1  # one co-location group: their joins on org_id stay in a shard
    for name in ("dw_index_documents", "dw_index_namespaces"):
        assert tables[name][:2] == ("h", "namespace")
    assert tables["dw_index_documents"][2] == tables["dw_index_namespaces"][2] not in org_groups
    for name in ("admin_feature_flags", "org_feature_flags"):
        assert tables[name][0] == "n"  # reference tables, on every node
    assert migrate(cluster.coordinator_url, dev_schema=True) == []  # again: nothing changes


@needs_source
def test_the_sparse_columns_stay_in_the_row_on_every_shard(cluster):
    """Migration 0015's storage MAIN, which Citus does not propagate: set on the shell table
    and on each shard (the lexical leg's scan reads no toast pages)."""
    migrate(cluster.coordinator_url, dev_schema=True)
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        shards = conn.execute(
            """SELECT result FROM run_command_on_shards('dw_message_embeddings',
                 $$SELECT string_agg(attname || '=' || attstorage::text, ',' ORDER BY attname) FROM pg_attribute
                   WHERE attrelid = '%s'::regclass AND attname IN ('lexical', 'sparse')$$)"""
        ).fetchall()
        (shell,) = conn.execute(
            """SELECT string_agg(attname || '=' || attstorage::text, ',' ORDER BY attname) FROM pg_attribute
               WHERE attrelid = 'dw_message_embeddings'::regclass AND attname IN ('lexical', 'sparse')"""
        ).fetchone()
    assert shards and {row[0] for row in shards} == {"lexical=m,sparse=m"} and shell == "lexical=m,sparse=m"


@needs_source
def test_the_lexical_projection_keeps_its_weights_in_the_row_on_every_shard(cluster):
    """Migration 0016 sets dw_lexical_windows' storage MAIN before distributing it: its
    shards copy it."""
    migrate(cluster.coordinator_url, dev_schema=True)
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        shards = conn.execute(
            """SELECT result FROM run_command_on_shards('dw_lexical_windows',
                 $$SELECT attstorage::text FROM pg_attribute WHERE attrelid = '%s'::regclass AND attname = 'lexical'$$)"""
        ).fetchall()
    assert shards and {row[0] for row in shards} == {"m"}


@needs_source
def test_the_lexical_projection_is_stored_uncompressed_on_every_shard(cluster):
    """Migration 0018 rewrites each shard's compressed projections (a distributed UPDATE may
    not call pg_column_compression): projections copied inside the shards as 0016 copied
    them, beside windows whose rows store their weights compressed, come out uncompressed."""
    migrate(cluster.coordinator_url, dev_schema=True)
    (rewrite,) = [m for m in migrations() if m.version == 18]
    text = " ".join(f"word{i}" for i in range(40))
    weights, _ = window_lexical(text)
    compression = """SELECT result FROM run_command_on_shards('{}',
                       $$SELECT coalesce(string_agg(DISTINCT pg_column_compression(lexical), ','), '-') FROM %s$$)"""
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO dw_message_embeddings (org_id, model, provider, external_channel_id, window_start,
                   window_end, embedding, lexical, content, source_message_ids)
               SELECT 'org-' || n, 'm', 'whatsapp', 'c1', now(), now(), %s::halfvec, %s::sparsevec, %s, '{}'
               FROM generate_series(1, 8) AS n""",
            ("[" + ",".join(["0.5"] * 1100) + "]", weights.to_text(), text),
        )
        # Copied inside each shard, as 0016 did: the compressed values stay compressed.
        conn.execute(
            """INSERT INTO dw_lexical_windows (id, org_id, model, provider, external_channel_id, window_start,
                   window_end, lexical)
               SELECT id, org_id, model, provider, external_channel_id, window_start, window_end, lexical
               FROM dw_message_embeddings"""
        )
        try:
            before = {row[0] for row in conn.execute(compression.format("dw_lexical_windows")).fetchall()}
            conn.execute(rewrite.sql)
            after = {row[0] for row in conn.execute(compression.format("dw_lexical_windows")).fetchall()}
            same = conn.execute(
                """SELECT bool_and(l.lexical::text = e.lexical::text), count(*) FROM dw_lexical_windows AS l
                   JOIN dw_message_embeddings AS e ON e.org_id = l.org_id AND e.id = l.id"""
            ).fetchone()
        finally:
            conn.execute("TRUNCATE dw_lexical_windows, dw_message_embeddings")
    assert "pglz" in before and after == {"-"} and same == (True, 8)


@needs_source
async def test_the_backfill_weighs_again_the_windows_of_an_older_term_extraction_on_every_shard(cluster):
    """Windows weighed before the lexical leg folded Traditional Chinese to Simplified
    (weights without the fold, lexical_terms NULL, as migration 0021 finds them) in orgs
    on every shard: the backfill, each statement naming its org, takes them through the
    coordinator a batch at a time, uncounts their old terms, weighs and projects them again
    and counts the new ones; a window whose weights come out the same keeps them. Then no
    org has any left, and the counts are those of the windows' weights."""
    from pgvector import SparseVector
    from pgvector.psycopg import register_vector_async

    from dwsearch.retrieval import bm25
    from dwsearch.sweep.store import lexical

    migrate(cluster.coordinator_url, dev_schema=True)
    orgs = [f"org-{n}" for n in range(1, 7)]
    texts = ["請問這個頻道的會員怎麼退貨", "訂單還沒有到, DW-7731", "the courier was late"]
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        # 0021's column and partial index, propagated to every shard.
        indexed = conn.execute(
            """SELECT result FROM run_command_on_shards('dw_message_embeddings',
                 $$SELECT count(*) FROM pg_index JOIN pg_attribute AS a ON a.attrelid = indrelid
                   WHERE indrelid = '%s'::regclass AND a.attname = 'lexical_terms'
                     AND position('lexical_terms' in pg_get_expr(indpred, indrelid)) > 0$$)"""
        ).fetchall()
        placements = conn.execute(
            """SELECT count(DISTINCT nodeport) FROM citus_shards
               WHERE table_name = 'dw_message_embeddings'::regclass
                 AND shardid IN (SELECT get_shard_id_for_distribution_column('dw_message_embeddings', o)
                                 FROM unnest(%s::text[]) AS o)""",
            (orgs,),
        ).fetchone()
        for org in orgs:
            for text in texts:
                weights = bm25.document_vector(text)  # no fold: the release before 0021's
                terms = [lexical.TOTAL, *sorted(weights)]
                (window,) = conn.execute(
                    """INSERT INTO dw_message_embeddings (org_id, model, provider, external_channel_id,
                           window_start, window_end, embedding, lexical, content, source_message_ids)
                       VALUES (%s, 'm', 'whatsapp', 'c1', now(), now(), '[1,0]'::halfvec, %s::sparsevec, %s, '{}')
                       RETURNING id""",
                    (org, SparseVector(weights, bm25.DIMENSION).to_text(), text),
                ).fetchone()
                conn.execute(
                    lexical.COUNT, {"org": org, "model": "m", "terms": terms, "deltas": [1] * len(terms)}
                )
                conn.execute(lexical.PROJECT, {"org": org, "windows": [window]})
    backfilling = await psycopg.AsyncConnection.connect(cluster.coordinator_url, autocommit=True)
    try:
        await register_vector_async(backfilling)
        pending = await lexical.backfill_pending(backfilling, orgs, ["m"])
        batches = {
            org: [await lexical.backfill(backfilling, org, "m", limit=2) for _ in range(3)] for org in orgs
        }
        left = await lexical.backfill_pending(backfilling, orgs, ["m"], recount=orgs)
    finally:
        await backfilling.close()
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        try:
            versions = conn.execute("SELECT DISTINCT lexical_terms FROM dw_message_embeddings").fetchall()
            weights = conn.execute(
                "SELECT org_id, content, lexical::text FROM dw_message_embeddings ORDER BY 1, 2"
            ).fetchall()
            counted = dict(
                ((org, term), n)
                for org, term, n in conn.execute(
                    "SELECT org_id, term, windows FROM dw_lexical_terms WHERE windows <> 0"
                ).fetchall()
            )
            projected = conn.execute(
                """SELECT count(*) FILTER (WHERE l.lexical::text = e.lexical::text), count(*)
                   FROM dw_lexical_windows AS l JOIN dw_message_embeddings AS e ON e.org_id = l.org_id AND e.id = l.id"""
            ).fetchone()
        finally:
            conn.execute("TRUNCATE dw_lexical_windows, dw_lexical_terms, dw_message_embeddings")
    assert indexed and {row[0] for row in indexed} == {"1"}
    assert placements == (2,)  # the orgs' windows on both workers
    assert [(p.org_id, p.stale) for p in pending] == [(org, True) for org in orgs]
    assert batches == {org: [2, 1, 0] for org in orgs} and left == []
    assert versions == [(lexical.LEXICAL_TERMS,)]
    expected, recounted = {}, {}
    for org in orgs:
        for text in texts:
            folded, terms = window_lexical(text)
            expected[(org, text)] = sorted(folded.indices())
            for term in terms:
                recounted[(org, term)] = recounted.get((org, term), 0) + 1
    stored = {
        (org, text): sorted(int(p.split(":")[0]) - 1 for p in body.split("/")[0].strip("{}").split(",") if p)
        for org, text, body in weights
    }
    assert stored == expected and counted == recounted
    assert projected == (len(orgs) * len(texts),) * 2


@needs_source
def test_the_demo_sweeps_and_searches_through_the_coordinator_of_a_distributed_cluster(tmp_path):
    """`dwsearch demo --citus-workers 2`: the sweep embeds every window into the distributed
    tables and hybrid search finds a Chinese conversation for an English question."""
    import subprocess
    import sys

    from dwsearch_testkit.net import free_port

    try:
        result = subprocess.run(
            [sys.executable, "-m", "dwsearch.cli", "demo", "--citus-workers", "2", "--data-dir", str(tmp_path),
             "--citus-source", str(SOURCE), "--server-port", str(free_port()), "--embedder-port", str(free_port())],
            capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
    finally:
        nodes = tmp_path / "citus" / citus.NODES_LINK
        if nodes.is_symlink():  # as root the kept cluster's nodes may lie outside tmp_path
            shutil.rmtree(nodes.resolve(), ignore_errors=True)
    out = result.stdout
    assert "kept there at stop" in out
    assert result.returncode == 0, out + result.stderr
    assert "Citus, a coordinator and 2 worker(s)" in out
    assert "10 windows embedded, 0 skipped, 0 poisoned" in out and "0 stalled" in out
    assert "[dense #1] 我的信用卡被扣了两次钱" in out  # 'charged twice on my credit card'


@needs_source
def test_a_per_org_knn_on_a_table_distributed_by_org_is_a_router_plan(cluster):
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE knn_probe (org_id text, id bigint, embedding halfvec(3), PRIMARY KEY (org_id, id))"
        )
        conn.execute("SELECT create_distributed_table('knn_probe', 'org_id')")
        conn.execute(
            "INSERT INTO knn_probe SELECT 'org-' || (i % 20), i, ARRAY[i, 1, 0]::halfvec(3)"
            " FROM generate_series(1, 200) AS i"
        )
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN SELECT id FROM knn_probe WHERE org_id = 'org-3'"
                " ORDER BY embedding <#> '[1,0,0]'::halfvec(3) LIMIT 5"
            ).fetchall()
        )
        assert "Task Count: 1" in plan, plan
        (rows,) = conn.execute("SELECT count(*) FROM knn_probe WHERE org_id = 'org-3'").fetchone()
        assert rows == 10
        # The rows live on the workers, split between them.
        placements = conn.execute(
            "SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = 'knn_probe'::regclass"
        ).fetchone()
        assert placements is not None and placements[0] == 2


@needs_source
def test_a_stack_whose_start_fails_stops_the_cluster_it_started(monkeypatch, tmp_path):
    """Every node stopped; the data kept in DWSEARCH_DATA_DIR, as one-node dev keeps its own."""
    from dwsearch import stack
    from dwsearch.common.config import StackConfig

    def failing_migrate(url: str, **kwargs: object) -> list[str]:
        raise RuntimeError("the migrations failed")

    monkeypatch.setattr(stack, "migrate", failing_migrate)
    local = stack.LocalStack(StackConfig(citus_workers=1, data_dir=tmp_path, citus_source=str(SOURCE)))
    with pytest.raises(RuntimeError, match="migrations failed"):
        local.start()
    cluster = local.cluster
    assert cluster is not None
    try:
        assert cluster.root == tmp_path / "citus" and (cluster.node_dir(0) / "PG_VERSION").exists()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(cluster.coordinator_url, connect_timeout=2)
    finally:
        cluster.keep = False
        cluster.close()  # its data too (as root it may lie outside tmp_path)


@needs_source
def test_a_kept_cluster_starts_again_with_its_data_on_its_ports(tmp_path):
    root = tmp_path / "kept"
    first = citus.CitusCluster(citus.build(SOURCE), workers=1, root=root, keep=True).start()
    try:
        ports = list(first.ports)
        with psycopg.connect(first.coordinator_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (org_id text, n int)")
            conn.execute("SELECT create_distributed_table('kept', 'org_id')")
            conn.execute("INSERT INTO kept VALUES ('org-a', 1), ('org-b', 2)")
    finally:
        first.close()
    assert (first.node_dir(0) / "PG_VERSION").exists()  # stopped, not deleted
    again = citus.CitusCluster(citus.build(SOURCE), workers=1, root=root, keep=True).start()
    try:
        assert again.ports == ports
        with psycopg.connect(again.coordinator_url, autocommit=True) as conn:
            assert conn.execute("SELECT sum(n) FROM kept").fetchone() == (3,)
    finally:
        again.keep = False
        again.close()
    assert not root.exists()
