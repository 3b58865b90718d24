"""bench.tenancy's populations: the shapes the figures claim (10,000 orgs, 100,000 keys,
a long tail and four large orgs) and the orgs both populations share, alike."""

from bench import tenancypop


def test_the_large_population_has_its_orgs_and_keys():
    orgs = tenancypop.plan_orgs(tenancypop.TEN_THOUSAND)
    assert len(orgs) == 10_000
    assert sum(channels for _, _, channels in orgs) == 100_000
    sizes = sorted(windows for _, windows, _ in orgs)
    assert sizes[-4:] == [20_000, 30_000, 40_000, 50_000]
    small = sizes[:-4]
    assert 100 <= small[len(small) // 2] <= 250  # most a few hundred windows
    assert all(channels >= 1 and channels <= windows for _, windows, channels in orgs)


def test_the_shared_orgs_are_alike_in_both_populations():
    big = {org: (w, c) for org, w, c in tenancypop.plan_orgs(tenancypop.TEN_THOUSAND)}
    fifty = {org: (w, c) for org, w, c in tenancypop.plan_orgs(tenancypop.FIFTY)}
    assert len(fifty) == 50
    shared = [tenancypop.small_org(i) for i in range(tenancypop.TEN_THOUSAND.shared_small)]
    assert all(big[org] == fifty[org] for org in shared)
    assert all(big[tenancypop.large_org(s)] == fifty[tenancypop.large_org(s)] for s in tenancypop.FIFTY.large)


async def test_a_population_is_copied_row_for_row_into_another_database(db_url, server_url, fake_embedder):
    """copy_population (the citus section's copy into a cluster), between two schemas of
    one server: every copied table's rows, vectors included, and the spec's marker."""
    import uuid
    from datetime import timedelta

    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.db.migrate import migrate
    from dwsearch.db.pool import open_pool
    from dwsearch.sweep.sweeper import Sweeper, SweepOptions
    from dwsearch_testkit.fakes import FAKE_MODEL
    from dwsearch_testkit.seed import T0, enable_semantic_search, insert_events

    enable_semantic_search(db_url, "org-a", "org-b")
    insert_events(
        db_url,
        [
            (
                org,
                "whatsapp",
                f"c{c}",
                f"{org} message {i} about the parcel",
                T0 + timedelta(minutes=i + 90 * c),
            )
            for org in ("org-a", "org-b")
            for c in range(3)
            for i in range(3)
        ],
    )
    pool = await open_pool(db_url, max_size=2)
    client = EmbedderClient(fake_embedder.address, timeout=10)
    try:
        async for _ in Sweeper(pool, client, model=FAKE_MODEL).sweep(SweepOptions()):
            pass
    finally:
        await client.close()
        await pool.close()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    target = make_conninfo(**{**conninfo_to_dict(server_url), "options": f"-c search_path={schema},public"})
    try:
        migrate(target, dev_schema=True)
        tenancypop.copy_population(db_url, target, tenancypop.QUICK_FIFTY, log=lambda _: None)
        with psycopg.connect(db_url) as src, psycopg.connect(target) as dst:
            for table in tenancypop.COPIED_TABLES:
                query = f"SELECT * FROM {table} ORDER BY 1, 2"
                rows = src.execute(query).fetchall()
                assert rows and dst.execute(query).fetchall() == rows, table
            flags = "SELECT org_id, flag_key, enabled FROM org_feature_flags ORDER BY 1, 2"
            assert dst.execute(flags).fetchall() == src.execute(flags).fetchall()
            assert tenancypop.built(dst, tenancypop.QUICK_FIFTY)
            # the secondary indexes are there again
            indexes = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 1"
            assert dst.execute(indexes).fetchall() == src.execute(indexes).fetchall()
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
