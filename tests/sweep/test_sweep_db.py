"""The sweep against real Postgres and the fake embedder over gRPC: the tier-1 list
(windowing, substance, watermark, model filter and swap, flags, retention) plus
concurrency, idempotency and a connection lost mid-sweep."""

import asyncio
from collections import Counter
from datetime import timedelta

import grpc
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sweep_harness import LATER, ORG, PROVIDER, T0, Harness, sweep_once, words

from dwsearch.common.errors import FailedPrecondition, InvalidArgument
from dwsearch.db.pool import open_pool
from dwsearch.flags import SEMANTIC_SEARCH_FLAG
from dwsearch.sweep.keyrun import POISON_AFTER_FAILURES
from dwsearch.sweep.store import keys, retention
from dwsearch.sweep.substance import SUBSTANCE_MIN_CHARS
from dwsearch.sweep.sweeper import Sweeper
from dwsearch.sweep.window import MAX_WINDOW_MESSAGES
from dwsearch_testkit.cluster import LOCK_WAITS, through_a_worker
from dwsearch_testkit.fakes import FAKE_MODEL, Failure
from dwsearch_testkit.seed import enable_semantic_search, set_org_flag

UNAVAILABLE = Failure(grpc.StatusCode.UNAVAILABLE, "embedder restarting")
INTERNAL = Failure(grpc.StatusCode.INTERNAL, "model produced NaN")
INVALID = Failure(grpc.StatusCode.INVALID_ARGUMENT, "cannot embed this")


def chat(n: int, start: float = 0, tag: str = "m") -> list[tuple[float, str]]:
    """n substantial messages a minute apart."""
    return [(start + i, f"{tag} message number {i} about the invoice") for i in range(n)]


async def test_backfill_embeds_closed_windows_with_content_vectors_and_watermark(harness: Harness):
    a = harness.insert(
        "c1", [(0, "Boleh tak migrate 那个 database?"), (3, "Clerk 还是 BetterAuth?"), (4, "BetterAuth")]
    )
    b = harness.insert("c1", chat(2, start=60))
    other = harness.insert("c2", chat(3))
    harness.insert("c1", [(5, "denied traffic is never embedded")], decision="denied")
    harness.insert("c1", [(6, "nor verification codes")], event_type="verification")

    progress = await harness.sweep()

    assert (progress.windows_embedded, progress.keys_total, progress.keys_done) == (3, 2, 2)
    assert progress.events_pending == progress.events_processed == 8
    assert set(harness.embedded()) == {tuple(a), tuple(b), tuple(other)} == await harness.expected()
    (row,) = harness.query(
        """SELECT content, provider, external_channel_id, window_start, window_end, sparse IS NOT NULL,
                  vector_dims(embedding) FROM dw_message_embeddings WHERE source_message_ids[1] = %s""",
        (a[0],),
    )
    assert row == (
        "Boleh tak migrate 那个 database?\nClerk 还是 BetterAuth?\nBetterAuth",
        PROVIDER,
        "c1",
        T0,
        T0 + timedelta(minutes=4),
        True,
        harness.fake.dimension,
    )
    assert harness.watermark("c1")[:2] == (b[-1], 0)


async def test_open_window_waits_until_its_session_closes(harness: Harness):
    ids = harness.insert("c1", chat(3))
    harness.clock.now = T0 + timedelta(minutes=20)
    progress = await harness.sweep()
    assert harness.embedded() == [] and progress.keys_done == 1
    assert harness.watermark("c1") is None

    harness.clock.now = T0 + timedelta(minutes=32)  # 30 minutes after the last message
    await harness.sweep()
    assert harness.embedded() == [tuple(ids)]


async def test_capped_session_continues_in_the_next_window(harness: Harness):
    ids = harness.insert("c1", chat(MAX_WINDOW_MESSAGES + 5))
    harness.clock.now = T0 + timedelta(minutes=MAX_WINDOW_MESSAGES + 5)  # still talking
    await harness.sweep()
    assert harness.embedded() == [tuple(ids[:MAX_WINDOW_MESSAGES])]
    assert harness.watermark("c1")[0] == ids[MAX_WINDOW_MESSAGES - 1]

    harness.clock.now = LATER
    await harness.sweep()
    assert harness.embedded() == [tuple(ids[:MAX_WINDOW_MESSAGES]), tuple(ids[MAX_WINDOW_MESSAGES:])]


async def test_token_cap_and_over_long_message_truncated_not_dropped(harness: Harness):
    harness.fake.max_input_tokens = 30
    long_text = words(60, "long")
    ids = harness.insert(
        "c1", [(0, words(12, "a")), (1, words(12, "b")), (2, words(12, "c")), (3, long_text)]
    )
    await harness.sweep()
    assert harness.embedded() == [tuple(ids[:2]), (ids[2],), (ids[3],)]
    # The model saw the long message cut to its limit; the stored content is whole.
    assert " ".join(long_text.split()[:28]) in harness.fake.received
    (content,) = harness.query(
        "SELECT content FROM dw_message_embeddings WHERE %s = ANY(source_message_ids)", (ids[3],)
    )
    assert content == (long_text,)


async def test_insubstantial_window_is_skipped_and_the_watermark_advances(harness: Harness):
    tiny = harness.insert("c1", [(0, "ok"), (1, "👍 thanks!")])
    real = harness.insert("c1", [(60, "ok"), (61, "the invoice from March is still unpaid")])
    progress = await harness.sweep()
    assert (progress.windows_skipped, progress.windows_embedded) == (1, 1)
    assert harness.embedded() == [tuple(real)]  # the trivial "ok" inside a real window stays
    assert harness.finished()[tuple(tiny)] == "skipped"
    assert harness.watermark("c1")[0] == real[-1]
    assert len("oktheinvoicefromMarchisstillunpaid") >= SUBSTANCE_MIN_CHARS
    assert (await harness.sweep()).keys_total == 0


async def test_transient_failure_stalls_the_key_and_others_go_on(harness: Harness):
    stuck = harness.insert("c1", chat(2, tag="stuck"))
    fine = harness.insert("c2", chat(2, tag="fine"))
    harness.fake.fail_texts[
        "stuck message number 0 about the invoice\nstuck message number 1 about the invoice"
    ] = UNAVAILABLE
    for _ in range(POISON_AFTER_FAILURES + 1):  # an outage never poisons
        progress = await harness.sweep()
        assert (progress.keys_stalled, progress.windows_poisoned) == (1, 0)
        assert [s.key.external_channel_id for s in progress.stalled] == ["c1"]
        assert "embedder restarting" in progress.stalled[0].error
    assert harness.embedded() == [tuple(fine)]
    assert harness.watermark("c1")[0] is None and "UNAVAILABLE" in harness.watermark("c1")[2]

    harness.fake.fail_texts.clear()
    progress = await harness.sweep()
    assert progress.keys_stalled == 0
    assert set(harness.embedded()) == {tuple(stuck), tuple(fine)}
    assert harness.watermark("c1")[1:] == (0, None)


async def test_invalid_argument_poisons_at_once_and_retry_poison_releases(harness: Harness):
    bad = harness.insert("c1", chat(2, tag="bad"))
    after = harness.insert("c1", chat(2, start=60, tag="after"))
    text = "bad message number 0 about the invoice\nbad message number 1 about the invoice"
    harness.fake.fail_texts[text] = INVALID
    progress = await harness.sweep()
    assert (progress.windows_poisoned, progress.windows_embedded, progress.keys_stalled) == (1, 1, 0)
    assert harness.embedded() == [tuple(after)]  # the watermark moved past the poison
    assert harness.finished()[tuple(bad)] == "poison"
    status = await harness.admin().status(ORG)
    (poison,) = status.poison
    assert (
        poison.source_message_ids == tuple(bad)
        and "INVALID_ARGUMENT" in poison.error
        and poison.attempts == 1
    )

    harness.fake.fail_texts.clear()
    assert await harness.admin().retry_poison(ORG, [poison.id]) == 1
    await harness.sweep()
    assert set(harness.embedded()) == {tuple(bad), tuple(after)}
    assert (await harness.admin().status(ORG)).poison == []


async def test_window_failing_n_sweeps_in_a_row_becomes_poison(harness: Harness):
    bad = harness.insert("c1", chat(2, tag="bad"))
    harness.fake.fail_texts[
        "bad message number 0 about the invoice\nbad message number 1 about the invoice"
    ] = INTERNAL
    for attempt in range(1, POISON_AFTER_FAILURES):
        progress = await harness.sweep()
        assert (progress.keys_stalled, progress.windows_poisoned) == (1, 0)
        assert harness.watermark("c1")[1] == attempt
    progress = await harness.sweep()
    assert (progress.keys_stalled, progress.windows_poisoned) == (0, 1)
    assert harness.finished()[tuple(bad)] == "poison"
    assert harness.watermark("c1")[:2] == (bad[-1], 0)


async def test_failure_inside_a_batch_is_pinned_on_its_window(harness: Harness):
    ids = [harness.insert("c1", chat(1, start=60 * i, tag=f"s{i}"))[0] for i in range(5)]
    harness.fake.fail_texts["s2 message number 0 about the invoice"] = INVALID
    progress = await harness.sweep()
    assert (progress.windows_embedded, progress.windows_poisoned) == (4, 1)
    assert harness.finished()[(ids[2],)] == "poison"


async def test_late_insert_is_never_lost(harness: Harness):
    first = harness.insert("c1", chat(3))
    second = harness.insert("c1", chat(3, start=120))
    await harness.sweep()
    assert harness.watermark("c1")[0] == second[-1]
    old_rows = harness.query("SELECT id FROM dw_message_embeddings")

    # Inserted now, created before the watermark: inside the first session, and alone
    # in the gap between the two.
    inside = harness.insert("c1", [(1.5, "a late message inside the first session")])
    alone = harness.insert("c1", [(60, "a late message alone between the sessions")])
    progress = await harness.sweep()

    assert harness.embedded() == [(first[0], first[1], inside[0], first[2]), tuple(alone), tuple(second)]
    assert set(harness.embedded()) == await harness.expected()
    assert progress.windows_embedded == 2  # the second session's window was confirmed, not re-embedded
    ids_now = {r[0] for r in harness.query("SELECT id FROM dw_message_embeddings")}
    assert len(ids_now & {r[0] for r in old_rows}) == 1  # the first window's row was replaced
    assert harness.watermark("c1")[0] == second[-1]
    assert (await harness.sweep()).keys_total == 0


async def test_event_dated_before_the_clock_closed_its_window_joins_it(harness: Harness):
    first = harness.insert("c1", chat(2))
    harness.clock.now = T0 + timedelta(minutes=40)  # 39 minutes after the last message: closed
    await harness.sweep()
    assert harness.embedded() == [tuple(first)]
    delayed = harness.insert("c1", [(20, "held up in ingest, dated twenty minutes in")])
    harness.clock.now = LATER
    await harness.sweep()
    assert (
        harness.embedded() == [tuple(first + delayed)] and set(harness.embedded()) == await harness.expected()
    )


async def test_model_mismatch_is_refused_and_nothing_written(harness: Harness):
    harness.insert("c1", chat(2))
    sweeper = harness.sweeper(model="BAAI/bge-m3")
    with pytest.raises(FailedPrecondition, match="BAAI/bge-m3"):
        await sweep_once(sweeper)
    assert harness.query("SELECT count(*) FROM dw_message_embeddings") == [(0,)]
    assert harness.query("SELECT count(*) FROM dw_sweep_watermarks") == [(0,)]


async def test_model_swap_rebuilds_and_keeps_the_old_rows(harness: Harness):
    ids = harness.insert("c1", chat(2))
    await harness.sweep()
    harness.fake.model_id = "fake/deterministic-v2"
    harness.fake.dimension = 16
    new = harness.sweeper(model="fake/deterministic-v2")
    progress = await sweep_once(new)
    assert progress.windows_embedded == 1
    assert harness.embedded(FAKE_MODEL) == harness.embedded("fake/deterministic-v2") == [tuple(ids)]
    assert harness.query(
        "SELECT model, vector_dims(embedding) FROM dw_message_embeddings ORDER BY model"
    ) == [
        (FAKE_MODEL, 32),
        ("fake/deterministic-v2", 16),
    ]
    assert len(harness.query("SELECT 1 FROM dw_sweep_watermarks")) == 2


async def test_flag_off_is_a_no_op_for_that_org(harness: Harness):
    harness.insert("c1", chat(2))
    off = harness.insert("c1", chat(2), org="org-off")
    set_org_flag(harness.url, "org-off", SEMANTIC_SEARCH_FLAG, False)
    progress = await harness.sweep()
    assert progress.keys_total == 1
    assert harness.embedded(org="org-off") == []

    progress = await harness.sweep(org_id="org-off")  # asking for it does not bypass the flag
    assert progress.keys_total == 0

    set_org_flag(harness.url, "org-off", SEMANTIC_SEARCH_FLAG, True)
    enable_semantic_search(harness.url, "org-off")
    await harness.sweep(org_id="org-off")
    assert harness.embedded(org="org-off") == [tuple(off)]


async def test_deleted_or_ineligible_events_take_their_windows_with_them(harness: Harness):
    first = harness.insert("c1", chat(4, tag="first"))
    second = harness.insert("c1", chat(3, start=100, tag="second"))
    untouched = harness.insert("c2", chat(2))
    elsewhere = harness.insert("c1", chat(2), org="org-b")
    enable_semantic_search(harness.url, "org-b")
    await harness.sweep()
    harness.fake.model_id = "fake/other"
    await sweep_once(harness.sweeper(model="fake/other"))
    harness.fake.model_id = FAKE_MODEL
    assert len(harness.embedded()) == len(harness.embedded("fake/other")) == 3

    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (first[1],))
    harness.query("UPDATE dw_chat_events SET decision = 'denied' WHERE id = %s RETURNING id", (second[0],))
    progress = await harness.sweep()
    assert progress.windows_dropped == 4  # two windows, both models
    # The rest of each dropped window is windowed again in the same sweep, without the
    # deleted or denied message; nothing else is touched.
    survivors = [tuple(i for i in first if i != first[1]), tuple(second[1:]), tuple(untouched)]
    assert harness.embedded() == survivors
    assert set(harness.embedded()) == await harness.expected()
    assert harness.embedded("fake/other") == [tuple(untouched)]  # left for its own sweep
    assert harness.embedded(org="org-b") == [tuple(elsewhere)]
    texts = " ".join(t for (t,) in harness.query("SELECT content FROM dw_message_embeddings"))
    assert "first message number 1 " not in texts and "second message number 0 " not in texts
    assert "first message number 2 " in texts and "second message number 1 " in texts

    again = await harness.sweep()
    assert (again.windows_dropped, again.windows_embedded) == (0, 0)


async def test_an_edited_message_is_embedded_again_with_its_new_text(harness: Harness):
    ids = harness.insert("c1", chat(3, tag="old"))
    kept = harness.insert("c2", chat(2, tag="kept"))
    await harness.sweep()
    assert (await harness.sweep()).windows_dropped == 0  # unchanged text: nothing to redo

    harness.query(
        "UPDATE dw_chat_events SET message_text = 'new text of the second message' WHERE id = %s"
        " RETURNING id",
        (ids[1],),
    )
    progress = await harness.sweep()
    assert (progress.windows_dropped, progress.windows_embedded) == (1, 1)
    assert harness.embedded() == [tuple(ids), tuple(kept)]
    (content,) = harness.query(
        "SELECT content FROM dw_message_embeddings WHERE source_message_ids[2] = %s", (ids[1],)
    )[0]
    assert "new text of the second message" in content and "old message number 1 " not in content
    assert (await harness.sweep()).windows_dropped == 0


async def test_windows_without_a_digest_are_not_checked_for_edits(harness: Harness):
    """Ledger rows written before migration 0004 carry no md5."""
    ids = harness.insert("c1", chat(2))
    await harness.sweep()
    harness.query("UPDATE dw_sweep_window_events SET text_md5 = NULL RETURNING event_id")
    harness.query("UPDATE dw_chat_events SET message_text = 'edited' WHERE id = %s RETURNING id", (ids[0],))
    assert (await harness.sweep()).windows_dropped == 0
    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (ids[0],))
    assert (await harness.sweep()).windows_dropped == 1  # deletions still are


async def test_stale_windows_are_dropped_even_when_the_embedder_is_not_usable(harness: Harness):
    ids = harness.insert("c1", chat(2))
    await harness.sweep()
    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (ids[0],))
    with pytest.raises(FailedPrecondition):
        await sweep_once(harness.sweeper(model="BAAI/bge-m3"))  # the embedder serves another model
    assert harness.embedded() == []


async def test_a_window_whose_event_is_deleted_while_it_is_embedded_is_not_written(harness: Harness):
    ids = harness.insert("c1", chat(3, tag="racing"))

    async def delete_one():  # inside the Embed call: after the sweep read the events
        harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (ids[1],))

    harness.fake.on_embed = delete_one
    progress = await harness.sweep()
    harness.fake.on_embed = None
    assert (progress.windows_embedded, progress.keys_stalled) == (0, 1)
    assert "changed under the sweep" in progress.stalled[0].error
    assert harness.embedded() == [] and harness.finished() == {}
    await harness.sweep()
    assert harness.embedded() == [(ids[0], ids[2])]


async def test_a_poison_window_with_a_deleted_event_is_tried_again(harness: Harness):
    """Its input changed: the rest of it is windowed and embedded afresh."""
    bad = harness.insert("c1", chat(3, tag="bad"))
    harness.fake.fail_texts["\n".join(f"bad message number {i} about the invoice" for i in range(3))] = (
        INVALID
    )
    await harness.sweep()
    assert harness.finished() == {tuple(bad): "poison"}
    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (bad[0],))
    progress = await harness.sweep()
    assert (progress.windows_dropped, progress.windows_embedded) == (1, 1)
    assert harness.finished() == {tuple(bad[1:]): "embedded"}


async def test_dropping_does_not_deadlock_with_a_purge_deleting_the_same_window(harness: Harness):
    """Purge and finish_window delete an embedding, then its window; so does the drop."""
    ids = harness.insert("c1", chat(2))
    await harness.sweep()
    ((window,),) = harness.query("SELECT id FROM dw_message_embeddings")
    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (ids[0],))
    async with (
        await psycopg.AsyncConnection.connect(harness.url) as other,
        await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as sweeper,
    ):
        await other.execute("DELETE FROM dw_message_embeddings WHERE id = %s", (window,))
        drop = asyncio.ensure_future(retention.drop_stale_windows(sweeper))
        for _ in range(100):  # until the drop waits on the row the other transaction holds
            if harness.query(LOCK_WAITS)[0][0]:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the drop never waited on the other transaction")
        await other.execute("DELETE FROM dw_sweep_windows WHERE id = %s", (window,))
        await other.commit()
        assert await asyncio.wait_for(drop, 10) == 0  # the other transaction deleted it first


async def test_windows_of_deleted_events_are_dropped_with_the_flag_off_too(harness: Harness):
    """Dropping only deletes: the text of a deleted message goes even from an org whose
    semantic search is off (and so is not embedded)."""
    ids = harness.insert("c1", chat(3), org="org-b")
    enable_semantic_search(harness.url, "org-b")
    await harness.sweep()
    set_org_flag(harness.url, "org-b", SEMANTIC_SEARCH_FLAG, False)
    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (ids[0],))
    progress = await harness.sweep()
    assert (progress.windows_dropped, progress.windows_embedded) == (1, 0)
    assert harness.embedded(org="org-b") == []


async def test_an_org_sweep_drops_only_that_orgs_windows(harness: Harness):
    mine = harness.insert("c1", chat(2))
    theirs = harness.insert("c1", chat(2), org="org-b")
    enable_semantic_search(harness.url, "org-b")
    await harness.sweep()
    harness.query("DELETE FROM dw_chat_events WHERE id = ANY(%s) RETURNING id", ([mine[0], theirs[0]],))
    assert (await harness.sweep(org_id=ORG)).windows_dropped == 1
    assert harness.embedded() == [(mine[1],)]
    assert harness.embedded(org="org-b") == [tuple(theirs)]  # until a sweep covers org-b


async def test_purge_deletes_windows_with_old_events_and_sweeps_never_embed_them(harness: Harness):
    old = harness.insert("c1", chat(2))
    straddling = harness.insert("c1", chat(4, start=100))  # 100..103
    recent = harness.insert("c1", chat(2, start=200))
    await harness.sweep()
    harness.fake.model_id = "fake/other"
    await sweep_once(harness.sweeper(model="fake/other"))
    harness.fake.model_id = FAKE_MODEL
    assert len(harness.embedded()) == len(harness.embedded("fake/other")) == 3

    cutoff = T0 + timedelta(minutes=102)
    deleted, poison = await harness.admin().purge(ORG, cutoff)
    assert (deleted, poison) == (4, 0)  # two windows, both models
    assert harness.embedded() == harness.embedded("fake/other") == [tuple(recent)]
    (row,) = harness.query("SELECT cutoff FROM dw_sweep_retention WHERE org_id = %s", (ORG,))
    assert row == (cutoff,)

    # The straddling window's events after the cutoff are swept again without the purged ones.
    await harness.sweep()
    assert harness.embedded() == [tuple(straddling[2:]), tuple(recent)]
    assert set(harness.embedded()) == await harness.expected()
    assert not set(old) & {i for w in harness.embedded() for i in w}

    # A late event older than the cutoff is never embedded.
    harness.insert("c1", [(1, "a late message from before the cutoff")])
    assert (await harness.sweep()).keys_total == 0

    with pytest.raises(InvalidArgument, match="future"):
        await harness.admin().purge(ORG, LATER + timedelta(days=1))


async def test_rerun_is_idempotent(harness: Harness):
    harness.insert("c1", chat(20))
    harness.insert("c2", chat(3))
    await harness.sweep()
    rows = harness.query("SELECT id, source_message_ids FROM dw_message_embeddings ORDER BY id")
    calls = harness.fake.calls
    progress = await harness.sweep()
    assert (progress.keys_total, progress.windows_finished) == (0, 0)
    assert harness.query("SELECT id, source_message_ids FROM dw_message_embeddings ORDER BY id") == rows
    assert harness.fake.calls == calls


async def test_budget_max_windows_and_duration(harness: Harness):
    for c in range(3):
        harness.insert(f"c{c}", [m for s in range(2) for m in chat(2, start=60 * s, tag=f"c{c}s{s}")])
    progress = await harness.sweep(max_windows=3)
    assert progress.budget_exhausted and progress.windows_finished == 3
    assert len(harness.embedded()) == 3
    progress = await harness.sweep(max_duration=1e-9)
    assert progress.budget_exhausted and progress.windows_finished == 0
    progress = await harness.sweep()
    assert not progress.budget_exhausted and len(harness.embedded()) == 6
    assert set(harness.embedded()) == await harness.expected()


async def test_two_sweepers_embed_each_window_exactly_once(harness: Harness):
    for c in range(8):
        harness.insert(f"c{c}", [m for s in range(3) for m in chat(4, start=60 * s, tag=f"c{c}s{s}")])
    harness.fake.delay = 0.01
    # On a cluster the other sweeper connects to a worker: the key locks must hold across nodes.
    other_pool = await open_pool(through_a_worker(harness.url), min_size=1, max_size=8)
    try:
        other = Sweeper(
            other_pool,
            harness.embedder,
            model=FAKE_MODEL,
            clock=harness.clock,
            redaction=harness.sweeper().redaction,
        )
        one, two = await asyncio.gather(sweep_once(harness.sweeper()), sweep_once(other))
    finally:
        await other_pool.close()
    assert one.windows_embedded + two.windows_embedded == 24
    assert one.keys_locked + two.keys_locked > 0 or min(one.windows_embedded, two.windows_embedded) == 0
    assert max(Counter(harness.fake.received).values()) == 1  # no chunk embedded twice
    embedded = harness.embedded()
    assert len(embedded) == len(set(embedded)) == 24
    assert set(embedded) == await harness.expected()


async def test_ledger_keeps_windows_unique_even_without_key_locks(harness: Harness, monkeypatch):
    """Defense in depth: with the key locks switched off both sweepers work every key at
    once; the ledger's primary key and the watermark check let one commit each window."""

    async def always(*_: object) -> bool:
        return True

    async def nothing(*_: object) -> None:
        return None

    monkeypatch.setattr(keys, "try_lock_key", always)
    monkeypatch.setattr(keys, "unlock_key", nothing)
    for c in range(4):
        harness.insert(f"c{c}", [m for s in range(3) for m in chat(2, start=60 * s, tag=f"c{c}s{s}")])
    harness.fake.delay = 0.01
    one, two = await asyncio.gather(harness.sweep(), harness.sweep())
    assert one.keys_stalled + two.keys_stalled > 0  # the losers of the races
    await harness.sweep()
    embedded = harness.embedded()
    assert len(embedded) == len(set(embedded)) == 12
    assert set(embedded) == await harness.expected()


async def test_database_connection_lost_mid_sweep(harness: Harness, db_url: str):
    for c in range(3):
        harness.insert(f"c{c}", [m for s in range(4) for m in chat(3, start=60 * s, tag=f"c{c}s{s}")])
    params = conninfo_to_dict(db_url)
    params["application_name"] = "dwsearch-sweep-under-test"
    pool = await open_pool(make_conninfo(**params), min_size=1, max_size=4)
    killed = []

    async def kill_the_sweeps_connections() -> None:
        if not killed:
            with psycopg.connect(db_url, autocommit=True) as conn:
                rows = conn.execute(
                    """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                       WHERE application_name = 'dwsearch-sweep-under-test'"""
                ).fetchall()
            killed.extend(rows)

    harness.fake.on_embed = kill_the_sweeps_connections
    try:
        sweeper = Sweeper(pool, harness.embedder, model=FAKE_MODEL, clock=harness.clock, concurrency=1)
        progress = await sweep_once(sweeper)
        assert killed
        assert progress.keys_stalled >= 1
        assert any("database" in s.error for s in progress.stalled)

        harness.fake.on_embed = None
        progress = await sweep_once(sweeper)
        assert progress.keys_stalled == 0
    finally:
        await pool.close()
    embedded = harness.embedded()
    assert len(embedded) == len(set(embedded)) == 12
    assert set(embedded) == await harness.expected()
