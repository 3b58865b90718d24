"""How a sweep finds its work at scale (dwsearch.sweep.store.discovery): new events from
the indexes every sweep, for every org; late inserts and stale windows by the full
check, which visits the least recently checked orgs first within its budget."""

from sweep_harness import ORG, Harness, sweep_once

from dwsearch.db.pool import open_pool
from dwsearch.sweep.store import discovery
from dwsearch.sweep.store.keys import Key
from dwsearch_testkit.fakes import FAKE_MODEL
from dwsearch_testkit.seed import enable_semantic_search

ORGS = ["org-a", "org-b", "org-c"]


def chat(n: int, start: float = 0, tag: str = "m") -> list[tuple[float, str]]:
    return [(start + i, f"{tag} message number {i} about the invoice") for i in range(n)]


def one_org_a_check(harness: Harness, monkeypatch):
    """A sweeper whose full check covers one org a sweep: batches of one, no budget."""
    monkeypatch.setattr(discovery, "FULL_CHECK_BATCH_ORGS", 1)
    return harness.sweeper(full_check_budget=0)


async def test_new_events_are_found_in_every_org_while_the_full_check_rotates(harness: Harness, monkeypatch):
    enable_semantic_search(harness.url, *ORGS)
    for org in ORGS:
        harness.insert("c1", chat(3), org=org)
    sweeper = one_org_a_check(harness, monkeypatch)
    first = await sweep_once(sweeper)
    # Never checked, never swept: every org's keys have no watermark and are found.
    assert first.windows_embedded == len(ORGS)  # one window each
    for org in ORGS:
        harness.insert("c1", chat(3, start=120, tag="later"), org=org)
    second = await sweep_once(sweeper)
    assert second.windows_embedded == len(ORGS)  # one org checked in full, the others from the indexes
    assert {org for (org,) in harness.query("SELECT org_id FROM dw_sweep_org_checks")} <= {*ORGS, ORG}


async def test_a_late_insert_waits_for_its_orgs_full_check(harness: Harness, monkeypatch):
    enable_semantic_search(harness.url, *ORGS)
    for org in ORGS:
        harness.insert("c1", chat(3), org=org)
        harness.insert("c1", chat(3, start=120), org=org)
    sweeper = one_org_a_check(harness, monkeypatch)
    rotation = [*ORGS, ORG]  # the harness's own org is on too
    for _ in rotation:
        await sweep_once(sweeper)  # every org checked once, in order
    checked = dict(harness.query("SELECT org_id, checked_at FROM dw_sweep_org_checks"))
    assert set(checked) == set(rotation)
    late_org = max(ORGS, key=lambda org: checked[org])  # of these, the last to come round again
    # Created before its key's watermark: only a full check of its org finds it.
    harness.insert("c1", [(60, "a late message alone between the sessions")], org=late_org)
    turn = sorted(rotation, key=lambda org: checked[org]).index(late_org)
    seen = [(await sweep_once(sweeper)).windows_embedded for _ in rotation]
    assert seen == [1 if i == turn else 0 for i in range(len(rotation))]  # when its turn came


async def test_forget_has_the_next_sweep_check_its_org_first(harness: Harness, monkeypatch):
    enable_semantic_search(harness.url, *ORGS)
    ids = {}
    for org in ORGS:
        ids[org] = harness.insert("c1", chat(3), org=org)
    sweeper = one_org_a_check(harness, monkeypatch)
    for _ in range(len(ORGS) + 1):  # and the harness's own org
        await sweep_once(sweeper)
    async with harness.pool.connection() as conn:
        order = await discovery.check_order(conn, ORGS)
    target = order[-1]
    assert await harness.admin().forget(target, [ids[target][0]]) == 1
    async with harness.pool.connection() as conn:
        assert (await discovery.check_order(conn, ORGS))[0] == target
    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (ids[target][0],))
    progress = await sweep_once(sweeper)
    assert progress.windows_embedded == 1  # the other two messages, windowed again at once


async def test_an_org_sweep_checks_that_org_in_full_whatever_the_budget(harness: Harness, monkeypatch):
    enable_semantic_search(harness.url, *ORGS)
    harness.insert("c1", chat(3), org="org-b")
    harness.insert("c1", chat(3, start=120), org="org-b")
    sweeper = one_org_a_check(harness, monkeypatch)
    await sweep_once(sweeper, org_id="org-b")
    harness.insert("c1", [(60, "a late message alone between the sessions")], org="org-b")
    assert (await sweep_once(sweeper, org_id="org-b")).windows_embedded == 1


async def test_keys_with_new_events_reads_the_indexes_for_new_work_only(harness: Harness):
    enable_semantic_search(harness.url, *ORGS)
    harness.insert("c1", chat(3), org="org-a")
    harness.insert("c2", chat(3), org="org-a")
    harness.insert("c1", chat(3), org="org-b")
    await harness.sweep()
    async with harness.pool.connection() as conn:
        assert await discovery.keys_with_new_events(conn, ORGS, FAKE_MODEL) == []
    harness.insert("c2", chat(2, start=200), org="org-a")  # after the watermark
    harness.insert("c9", chat(1), org="org-b")  # a key no sweep has reached
    harness.insert("c1", [(300, "denied")], org="org-b", decision="denied")  # ineligible: no work
    harness.insert("c7", chat(1), org="org-off")  # an org whose flags are off
    async with harness.pool.connection() as conn:
        found = await discovery.keys_with_new_events(conn, ORGS, FAKE_MODEL)
        assert set(found) == {Key("org-a", "whatsapp", "c2"), Key("org-b", "whatsapp", "c9")}
        assert await discovery.keys_with_new_events(conn, [], FAKE_MODEL) == []
        # One org: its own statement (each table named by the org's id), the same answer.
        for org in ORGS:
            alone = await discovery.keys_with_new_events(conn, [org], FAKE_MODEL)
            assert set(alone) == {k for k in found if k.org_id == org}


async def test_check_order_covers_orgs_with_windows_whose_flags_are_off(harness: Harness, db_url: str):
    enable_semantic_search(harness.url, "org-a")
    harness.insert("c1", chat(3), org="org-a")
    await harness.sweep()
    pool = await open_pool(db_url)
    try:
        async with pool.connection() as conn:
            # org-a has windows; org-z is on but has none and was never checked.
            assert await discovery.check_order(conn, ["org-z"]) == ["org-z", "org-a"]
            assert await discovery.oldest_check(conn, ["org-a"]) is not None
            assert await discovery.oldest_check(conn, ["org-a", "org-z"]) is None
            # Among the orgs named only (a sweep with a worker down): never checked first.
            assert await discovery.check_order_among(conn, ["org-a", "org-z", "org-y"]) == [
                "org-y",
                "org-z",
                "org-a",
            ]
            await discovery.check_again(conn)
            assert await discovery.oldest_check(conn, ["org-a"]) is None
    finally:
        await pool.close()
