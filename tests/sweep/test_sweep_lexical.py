"""The lexical leg's side of the sweep (migration 0014): every embedded window's BM25 weights
written with it, the per-org document frequencies kept exact through every way a window
goes (replaced by a late event, dropped for an edit, purged), and the backfill of windows
embedded before the leg existed or weighed by an older term extraction (migration 0021)."""

import asyncio
from collections import Counter
from datetime import timedelta

import psycopg
from pgvector import SparseVector
from pgvector.psycopg import register_vector, register_vector_async
from polling import until
from psycopg import sql
from sweep_harness import ORG, T0, Harness

from dwsearch.retrieval import bm25
from dwsearch.sweep.store import lexical, retention
from dwsearch.sweep.store.lexical import TOTAL
from dwsearch_testkit.cluster import WAITING_STATEMENT, one_node_only


def chat(n: int, start: float = 0, tag: str = "m") -> list[tuple[float, str]]:
    return [(start + i, f"{tag} 第{i}条消息 about the invoice 退款") for i in range(n)]


def counted(harness: Harness) -> dict[tuple[str, str, int], int]:
    rows = harness.query("SELECT org_id, model, term, windows FROM dw_lexical_terms WHERE windows <> 0")
    return {(org, model, term): n for org, model, term, n in rows}


def recounted(harness: Harness) -> dict[tuple[str, str, int], int]:
    """The document frequencies counted again from the windows themselves, in Python."""
    with psycopg.connect(harness.url) as conn:
        register_vector(conn)
        rows = conn.execute(
            "SELECT org_id, model, content, lexical FROM dw_message_embeddings WHERE lexical IS NOT NULL"
        ).fetchall()
    counts: Counter[tuple[str, str, int]] = Counter()
    for org, model, content, stored in rows:
        weights = dict(zip(stored.indices(), stored.values(), strict=True))
        expected = bm25.document_vector(content, fold=True)  # as lexical.window_lexical weighs it
        assert weights.keys() == expected.keys()  # the weights of the text it embedded
        assert all(abs(weights[t] - w) < 1e-5 for t, w in expected.items())
        counts.update((org, model, term) for term in [TOTAL, *weights])
    assert projected(harness) == []
    return dict(counts)


def projected(harness: Harness) -> list[tuple]:
    """The windows whose projection (dw_lexical_windows, what the lexical leg scans) is not
    their row's columns and weights: a window with weights has it, one without has none."""
    return harness.query(
        """SELECT e.id, l.id FROM (SELECT * FROM dw_message_embeddings WHERE lexical IS NOT NULL) AS e
           FULL JOIN dw_lexical_windows AS l ON l.org_id = e.org_id AND l.id = e.id
           WHERE (e.org_id, e.model, e.provider, e.external_channel_id, e.window_start, e.window_end,
                  e.lexical::text)
                 IS DISTINCT FROM (l.org_id, l.model, l.provider, l.external_channel_id, l.window_start,
                                   l.window_end, l.lexical::text)"""
    )


def embedded_before_the_leg(harness: Harness) -> None:
    """Windows as a database migrated to 0014 has them: no weights, nothing counted, nothing
    projected."""
    harness.query("UPDATE dw_message_embeddings SET lexical = NULL RETURNING 1")
    harness.query("DELETE FROM dw_lexical_terms RETURNING 1")
    harness.query("DELETE FROM dw_lexical_windows RETURNING 1")


async def test_every_window_has_its_weights_and_the_counts_stay_exact(harness: Harness):
    first = harness.insert("c1", chat(3))
    harness.insert("c1", chat(3, start=120, tag="second"))
    edited = harness.insert("c2", chat(2, tag="edited"))
    harness.insert("c3", chat(2, start=300, tag="recent"))
    await harness.sweep()
    assert counted(harness) == recounted(harness)
    assert counted(harness)[(ORG, harness.fake.model_id, TOTAL)] == 4

    # Replaced: a late event joins the first window, which is written again.
    harness.insert("c1", [(1.5, "a late 迟到的 message inside the first session")])
    await harness.sweep()
    assert len(harness.embedded()) == 4 and counted(harness) == recounted(harness)

    # Dropped: an edited message takes its window with it, then it is windowed again.
    harness.query(
        "UPDATE dw_chat_events SET message_text = 'changed 改了' WHERE id = %s RETURNING id", (edited[0],)
    )
    assert (await harness.sweep()).windows_dropped == 1
    assert counted(harness) == recounted(harness)

    # Purged: the windows before the cutoff go, and their counts with them.
    deleted, _ = await harness.admin().purge(ORG, T0 + timedelta(minutes=200))
    assert deleted == 3 and counted(harness) == recounted(harness)
    assert counted(harness)[(ORG, harness.fake.model_id, TOTAL)] == 1
    assert not set(first) & {i for w in harness.embedded() for i in w}


async def test_windows_embedded_before_the_lexical_leg_are_backfilled(harness: Harness):
    harness.insert("c1", chat(3))
    harness.insert("c2", chat(2, tag="other"))
    await harness.sweep()
    before = counted(harness)
    embedded_before_the_leg(harness)

    progress = await harness.sweep()
    assert progress.windows_embedded == 0  # nothing embedded again: weights from the content
    assert harness.query("SELECT count(*) FROM dw_message_embeddings WHERE lexical IS NULL") == [(0,)]
    assert counted(harness) == recounted(harness) == before


def written_by_the_release_before(harness: Harness, contents: tuple[str, ...] | None = None) -> None:
    """The windows of `contents` (None: every window) as a sweep of the release before
    migration 0021 wrote them: their weights without the fold (bm25's terms as they were)
    and no version (lexical_terms NULL). The other windows keep their weights; every
    window's counts and projection are written again from scratch, so they are exact."""
    with psycopg.connect(harness.url) as conn:
        register_vector(conn)
        rows = conn.execute(
            "SELECT org_id, model, id, content, lexical FROM dw_message_embeddings"
        ).fetchall()
        conn.execute("DELETE FROM dw_lexical_terms")
        conn.execute("DELETE FROM dw_lexical_windows")
        for org, model, window, content, stored in rows:
            if contents is None or content in contents:
                weights = bm25.document_vector(content)  # no fold
                stored = SparseVector(weights, bm25.DIMENSION)
                conn.execute(
                    """UPDATE dw_message_embeddings SET lexical = %s, lexical_terms = NULL
                       WHERE org_id = %s AND id = %s""",
                    (stored, org, window),
                )
            terms = [TOTAL, *stored.indices()]
            conn.execute(
                lexical.COUNT, {"org": org, "model": model, "terms": terms, "deltas": [1] * len(terms)}
            )
            conn.execute(lexical.PROJECT, {"org": org, "windows": [window]})


def counted_from_the_weights(harness: Harness) -> dict[tuple[str, str, int], int]:
    """The document frequencies counted again from the windows' stored weights, whichever
    term extraction made them (recounted() also checks that they are this release's)."""
    with psycopg.connect(harness.url) as conn:
        register_vector(conn)
        rows = conn.execute(
            "SELECT org_id, model, lexical FROM dw_message_embeddings WHERE lexical IS NOT NULL"
        ).fetchall()
    counts: Counter[tuple[str, str, int]] = Counter()
    for org, model, stored in rows:
        counts.update((org, model, term) for term in [TOTAL, *stored.indices()])
    assert projected(harness) == []
    return dict(counts)


def versions(harness: Harness) -> dict[str, int | None]:
    """Each window's term extraction (lexical_terms), by its content."""
    return dict(harness.query("SELECT content, lexical_terms FROM dw_message_embeddings"))


def projection_writes(harness: Harness) -> dict[str, str]:
    """The transaction that wrote each window's projection (xmin), by its content."""
    return dict(
        harness.query(
            """SELECT e.content, l.xmin::text FROM dw_lexical_windows AS l
               JOIN dw_message_embeddings AS e ON e.org_id = l.org_id AND e.id = l.id"""
        )
    )


TRADITIONAL = "請問這個頻道的會員怎麼退貨\n訂單 DW-7731"
SIMPLIFIED = "请问频道会员退货要多久才能到账, order DW-7731"
ENGLISH = "the courier was late, boleh semak pesanan saya"


async def test_windows_weighed_by_an_older_term_extraction_are_weighed_again(harness: Harness):
    """Windows weighed before the lexical leg folded Traditional Chinese to Simplified
    (their weights without the fold, lexical_terms NULL: as migration 0021 finds them, and
    as a sweep of the release before writes them during a rolling upgrade) are weighed
    again by the backfill, a batch at a time: their old terms uncounted, their new ones
    counted, their projections written again, the counts exact after every batch. A window
    whose weights come out the same keeps them and its projection, and gets the version.
    A window a sweep of the release before writes after that is weighed again by the next
    sweep."""
    # (A window of fewer than 20 letters and digits is not embedded: sweep.substance.)
    harness.insert("c1", [(0, "請問這個頻道的會員怎麼退貨"), (1, "訂單 DW-7731")])
    harness.insert("c2", [(100, SIMPLIFIED)])
    harness.insert("c3", [(200, ENGLISH)])
    await harness.sweep()
    folded = counted(harness)
    model = harness.fake.model_id
    assert versions(harness) == dict.fromkeys([TRADITIONAL, SIMPLIFIED, ENGLISH], lexical.LEXICAL_TERMS)

    written_by_the_release_before(harness)
    before = counted(harness)
    assert before == counted_from_the_weights(harness) and before != folded
    wanted = bm25.term_id("频道")
    assert before[(ORG, model, wanted)] == 1  # the Simplified window's only
    assert set(versions(harness).values()) == {None}
    assert [p.stale for p in await pending(harness)] == [True]
    written = projection_writes(harness)

    # Two windows at a time: the counts exact after each batch, the third left to the sweep.
    conn = await held(harness.url)
    try:
        assert await lexical.backfill(conn, ORG, model, limit=2) == 2
        assert list(versions(harness).values()).count(None) == 1
        assert counted(harness) == counted_from_the_weights(harness)
    finally:
        await conn.close()
    progress = await harness.sweep()
    assert progress.windows_embedded == 0  # weighed again from their content, not embedded
    assert versions(harness) == dict.fromkeys([TRADITIONAL, SIMPLIFIED, ENGLISH], lexical.LEXICAL_TERMS)
    assert counted(harness) == recounted(harness) == folded
    assert folded[(ORG, model, wanted)] == 2  # both scripts' windows
    assert await pending(harness) == []
    # The fold changes nothing of the Simplified and English windows: only their version
    # was written; the Traditional window's projection was written again.
    again = projection_writes(harness)
    assert [again[c] == written[c] for c in (TRADITIONAL, SIMPLIFIED, ENGLISH)] == [False, True, True]

    # A sweep of the release before writes the Traditional window again (as it writes a
    # window whose late event joins it): without the fold and without a version.
    written_by_the_release_before(harness, (TRADITIONAL,))
    assert versions(harness)[TRADITIONAL] is None
    assert counted(harness) == counted_from_the_weights(harness) != folded
    await harness.sweep()
    assert versions(harness)[TRADITIONAL] == lexical.LEXICAL_TERMS
    assert counted(harness) == recounted(harness) == folded


async def pending(harness: Harness) -> list[lexical.Pending]:
    conn = await held(harness.url)
    try:
        return await lexical.backfill_pending(conn, [ORG], [harness.fake.model_id])
    finally:
        await conn.close()


@one_node_only(
    "each worker plans its shard's statement, with its own settings and statistics; test_citus checks "
    "that every shard has the index"
)
def test_the_backfill_finds_the_windows_of_an_older_version_by_their_partial_index(db_url):
    """The backfill's statements for the windows of an older term extraction ask migration
    0021's partial index, whose predicate is lexical.STALE as it stands (a LEXICAL_TERMS
    bumped without a migration building the index of the new one fails here). In a
    transaction rolled back: nothing stays."""
    windows = """INSERT INTO dw_message_embeddings (org_id, model, provider, external_channel_id, window_start,
                     window_end, embedding, lexical, lexical_terms, content, source_message_ids)
                 SELECT 'org-' || n %% 4, 'm', 'whatsapp', 'c1', now(), now(), '[1,0]'::halfvec,
                        '{1:1}/1000000000', CASE WHEN n %% 7 = 0 THEN NULL ELSE %s END, 'x', '{}'
                 FROM generate_series(1, 2000) AS n"""
    params = {"org": "org-1", "model": "m", "limit": 10}
    with psycopg.connect(db_url) as conn:
        conn.execute(windows, (lexical.LEXICAL_TERMS,))
        conn.execute("ANALYZE dw_message_embeddings")
        conn.execute("SET LOCAL enable_seqscan = off")
        plans = []
        for statement in (lexical.TAKE_STALE, lexical._TO_WEIGH):
            rows = conn.execute(sql.SQL("EXPLAIN ") + statement, params).fetchall()
            plans.append("\n".join(line for (line,) in rows))
        taken = conn.execute(lexical.TAKE_STALE, params).fetchall()
        (probed,) = conn.execute(lexical._TO_WEIGH, params).fetchall()
        conn.rollback()
    assert all("dw_message_embeddings_lexical_stale_idx" in plan for plan in plans), plans
    assert len(taken) == 10 and probed == (False, True)


async def test_windows_with_weights_and_no_projection_are_projected_by_the_full_check(harness: Harness):
    """A window a sweep of the release before migration 0016 wrote while 0016 ran has its
    weights, counted, and no projection: the next sweep's full check finds it by the org's
    counts and projects it, so that the lexical leg finds it again."""
    harness.insert("c1", chat(3))
    harness.insert("c2", chat(2, start=100, tag="other"))
    await harness.sweep()
    before = counted(harness)
    ((window,),) = harness.query("SELECT id FROM dw_lexical_windows ORDER BY window_start LIMIT 1")
    harness.query("DELETE FROM dw_lexical_windows WHERE org_id = %s AND id = %s RETURNING 1", (ORG, window))
    assert len(projected(harness)) == 1

    await harness.sweep()
    assert projected(harness) == []
    assert counted(harness) == recounted(harness) == before


async def test_the_projection_is_stored_uncompressed_beside_a_wide_row(harness: Harness):
    """Beside a dense vector of 1,100 dimensions a window's row passes the toast threshold and
    its weights are stored compressed; the projection the leg scans holds them uncompressed,
    as the backfill projects them (PROJECT) and as the full check projects them again
    (REPROJECT): a compressed value copied as it is would stay compressed in the narrow row."""
    long_text = " ".join(f"word{i}" for i in range(40)) + " 订单 DW-7731"
    harness.insert("c1", [(0, long_text), (1, long_text + " late")])
    await harness.sweep()
    wide = "[" + ",".join(["0.5"] * 1100) + "]"
    harness.query("UPDATE dw_message_embeddings SET embedding = %s::halfvec RETURNING 1", (wide,))
    embedded_before_the_leg(harness)
    compression = "SELECT DISTINCT pg_column_compression(lexical) FROM {}"

    await harness.sweep()  # the backfill: weights written beside the wide vector, projected
    assert harness.query(compression.format("dw_message_embeddings")) == [("pglz",)]
    assert harness.query(compression.format("dw_lexical_windows")) == [(None,)]
    harness.query("DELETE FROM dw_lexical_windows RETURNING 1")
    await harness.sweep()  # the full check projects them again
    assert harness.query(compression.format("dw_lexical_windows")) == [(None,)]
    assert counted(harness) == recounted(harness)  # projected() == [] within


async def test_the_backfill_replaces_a_projection_without_weights_behind_it(harness: Harness):
    """A projection left by a hand-made repair (its window's weights set back to NULL) is
    replaced by the backfill's, not a duplicate key that stops the backfill."""
    harness.insert("c1", chat(3))
    await harness.sweep()
    before = counted(harness)
    harness.query("UPDATE dw_message_embeddings SET lexical = NULL RETURNING 1")
    harness.query("DELETE FROM dw_lexical_terms RETURNING 1")
    harness.query("UPDATE dw_lexical_windows SET lexical = '{1:1}/1000000000' RETURNING 1")

    await harness.sweep()
    assert counted(harness) == recounted(harness) == before  # projected() == [] within


async def test_a_windows_weights_stay_in_its_row(harness: Harness):
    """Storage MAIN (migration 0015): beside the dense vector the row passes the toast
    threshold, and the lexical leg's scan must not read each window's weights out of line."""
    harness.insert("c1", chat(3))
    await harness.sweep()
    ((lexical, sparse),) = harness.query(
        """SELECT max(attstorage::text) FILTER (WHERE attname = 'lexical'),
                  max(attstorage::text) FILTER (WHERE attname = 'sparse')
           FROM pg_attribute WHERE attrelid = 'dw_message_embeddings'::regclass"""
    )
    assert (lexical, sparse) == ("m", "m")


async def held(url: str):
    """An open transaction on a connection of its own (to hold the locks a call takes)."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await register_vector_async(conn)
    return conn


async def test_two_deletes_of_one_window_uncount_it_once(harness: Harness):
    """A window's terms are uncounted from what its DELETE returned: a second delete of
    the same window (a full check racing Forget, or two sweeps' checks) waits, then finds
    nothing to delete and uncounts nothing."""
    harness.insert("c1", chat(3))
    harness.insert("c2", chat(2, start=100, tag="other"))
    await harness.sweep()
    ((window,),) = harness.query("SELECT id FROM dw_message_embeddings WHERE content LIKE %s", ("%m 第0条%",))
    first, second = await held(harness.url), await held(harness.url)
    try:
        async with first.transaction():
            assert await retention._drop_windows(first, [window], ORG) == 1
            racing = asyncio.ensure_future(retention._drop_windows(second, [window], ORG))
            await until(
                lambda: harness.query(WAITING_STATEMENT, ("%DELETE FROM dw_message_embeddings%",)),
                what="the second delete to wait on the first's row lock",
            )
            assert not racing.done()
        assert await racing == 0
    finally:
        await first.close()
        await second.close()
    assert counted(harness) == recounted(harness)
    assert counted(harness)[(ORG, harness.fake.model_id, TOTAL)] == 1


async def test_a_purge_waiting_for_the_backfill_uncounts_what_it_wrote(harness: Harness):
    """The backfill locks the windows it weighs, then the terms, as every writer does: a
    purge that waits for it deletes the windows with the weights the backfill wrote and
    uncounts them; neither deadlocks."""
    harness.insert("c1", chat(3))
    harness.insert("c2", chat(2, start=100, tag="other"))
    await harness.sweep()
    embedded_before_the_leg(harness)
    backfilling, purging = await held(harness.url), await held(harness.url)
    try:
        async with backfilling.transaction():
            assert await lexical.backfill(backfilling, ORG, harness.fake.model_id) == 2
            purge = asyncio.ensure_future(retention.purge(purging, ORG, T0 + timedelta(minutes=200)))
            await until(
                lambda: harness.query(WAITING_STATEMENT, ("%DELETE FROM dw_message_embeddings%",)),
                what="the purge to wait on the backfill's row locks",
            )
            assert not purge.done()
        deleted, _ = await purge
    finally:
        await backfilling.close()
        await purging.close()
    assert deleted == 2 and harness.query("SELECT count(*) FROM dw_message_embeddings") == [(0,)]
    assert counted(harness) == recounted(harness) == {}


async def test_a_purge_waiting_for_the_backfill_weighing_again_uncounts_the_new_weights(harness: Harness):
    """The backfill locks the windows it weighs again, then their projections, then the
    terms, as every writer does: a purge that waits for it deletes the windows with the
    weights the backfill wrote and uncounts those, not the old ones; neither deadlocks."""
    harness.insert("c1", [(0, "請問這個頻道的會員怎麼退貨"), (1, "訂單 DW-7731")])
    harness.insert("c2", [(100, ENGLISH)])
    await harness.sweep()
    written_by_the_release_before(harness)
    backfilling, purging = await held(harness.url), await held(harness.url)
    try:
        async with backfilling.transaction():
            assert await lexical.backfill(backfilling, ORG, harness.fake.model_id) == 2
            purge = asyncio.ensure_future(retention.purge(purging, ORG, T0 + timedelta(minutes=200)))
            await until(
                lambda: harness.query(WAITING_STATEMENT, ("%DELETE FROM dw_message_embeddings%",)),
                what="the purge to wait on the backfill's row locks",
            )
            assert not purge.done()
        deleted, _ = await purge
    finally:
        await backfilling.close()
        await purging.close()
    assert deleted == 2 and harness.query("SELECT count(*) FROM dw_message_embeddings") == [(0,)]
    assert counted(harness) == recounted(harness) == {}
