"""Range as Upstash pages it: insertion order, and a cursor that is the next record's place
in its namespace ("5" after the first five records of a new or reset namespace), which
never moves: pages neither skip nor repeat a record that stays, whatever is deleted or
added between them or while they are read, and the cursors given before places were
counted per namespace still page on (dwsearch.index.store.take_places)."""

from __future__ import annotations

import asyncio
import random

import pytest

from dwsearch.index.documents import encode_cursor
from dwsearch.rest.upstash import NAMESPACE_SEPARATOR

pytestmark = pytest.mark.timeout(120)


async def page_all(ix, *, limit: int, namespace: str = "", cursor: str = "") -> tuple[list[str], list[str]]:
    """Every page's ids, in order, and the cursors given."""
    ids, cursors = [], []
    while True:
        page = await ix.range(cursor=cursor, limit=limit, namespace=namespace)
        ids += [v.id for v in page.vectors]
        if not page.next_cursor:
            return ids, cursors
        cursor = page.next_cursor
        cursors.append(cursor)


async def test_a_new_namespace_s_cursor_is_the_next_record_s_place(index):
    """What the TypeScript suite expects: "5" after five records; a reset namespace counts
    from 0 again, and each namespace (of each index) counts its own."""
    ix = index()
    for namespace in ("", "ns"):
        await ix.upsert(vectors=[(f"id-{i}", [1.0, float(i)]) for i in range(20)], namespace=namespace)
        ids, cursors = await page_all(ix, limit=5, namespace=namespace)
        assert ids == [f"id-{i}" for i in range(20)] and cursors == ["5", "10", "15"]
    await index("dot-token").upsert(vectors=[(f"d-{i}", [1.0, 0.0, float(i)]) for i in range(7)])
    assert (await index("dot-token").range(cursor="", limit=5)).next_cursor == "5"
    await ix.reset()
    await ix.upsert(vectors=[(f"new-{i}", [1.0, float(i)]) for i in range(6)])
    assert (await ix.range(cursor="0", limit=5)).next_cursor == "5"
    assert (await ix.range(cursor="", limit=5, namespace="ns")).next_cursor == "5"  # not reset
    await ix.reset(all=True)
    await ix.upsert(vectors=[(f"again-{i}", [1.0, float(i)]) for i in range(6)], namespace="ns")
    assert (await ix.range(cursor="", limit=5, namespace="ns")).next_cursor == "5"
    # A deleted namespace is a new one when written again.
    await ix.delete_namespace("ns")
    await ix.upsert(vectors=[(f"re-{i}", [1.0, float(i)]) for i in range(6)], namespace="ns")
    assert (await ix.range(cursor="", limit=5, namespace="ns")).next_cursor == "5"


async def test_pages_neither_skip_nor_repeat_a_record_that_stays_when_others_change_between_them(index):
    ix = index()
    await ix.upsert(vectors=[(f"id-{i:02d}", [1.0, float(i)]) for i in range(30)])
    first = await ix.range(cursor="", limit=10)
    assert [v.id for v in first.vectors] == [f"id-{i:02d}" for i in range(10)] and first.next_cursor == "10"
    # Records already read and records still to read deleted, one replaced (its place
    # kept), new ones added: none of it moves the records still to read.
    await ix.delete(ids=["id-00", "id-03", "id-09", "id-15", "id-16"])
    await ix.upsert(vectors=[("id-20", [2.0, 1.0]), ("late-a", [1.0, 1.0]), ("late-b", [1.0, 2.0])])
    rest, _ = await page_all(ix, limit=10, cursor=first.next_cursor)
    assert rest == [f"id-{i:02d}" for i in range(10, 30) if i not in (15, 16)] + ["late-a", "late-b"]


async def test_pages_read_while_others_write_see_every_record_that_stays_once(index):
    """A reader pages (3 at a time) while a writer deletes and adds records of the same
    namespace, from two servers' worth of indexes: every record there from the first page
    to the last comes exactly once, and none twice."""
    ix = index()
    await ix.upsert(vectors=[(f"stay-{i:03d}", [1.0, float(i)]) for i in range(60)], namespace="busy")
    await ix.upsert(vectors=[(f"go-{i:03d}", [1.0, float(i)]) for i in range(60)], namespace="busy")
    doomed = [f"go-{i:03d}" for i in range(60)]
    random.Random(7).shuffle(doomed)
    writers = [index(), index("dense-token-2")]

    async def write() -> None:
        for n, start in enumerate(range(0, 60, 6)):
            writer = writers[n % 2]
            await writer.delete(ids=doomed[start : start + 6], namespace="busy")
            await writer.upsert(
                vectors=[(f"new-{start + j:03d}", [2.0, float(j)]) for j in range(6)], namespace="busy"
            )
            await asyncio.sleep(0)

    async def read() -> list[str]:
        ids, cursor = [], ""
        while True:
            page = await ix.range(cursor=cursor, limit=3, namespace="busy")
            ids += [v.id for v in page.vectors]
            if not page.next_cursor:
                return ids
            cursor = page.next_cursor
            await asyncio.sleep(0)

    _, seen = await asyncio.gather(write(), read())
    assert len(seen) == len(set(seen))
    assert [i for i in seen if i.startswith("stay-")] == [f"stay-{i:03d}" for i in range(60)]


async def test_concurrent_upserts_into_one_namespace_take_places_of_their_own(index, pool):
    writers = [index(), index("dense-token-2")]
    await asyncio.gather(*(
        writers[n % 2].upsert(vectors=[(f"w{n}-{j}", [1.0, float(j)]) for j in range(5)], namespace="race")
        for n in range(12)
    ))  # fmt: skip
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM dw_index_documents WHERE namespace = %s",
            [f"dense{NAMESPACE_SEPARATOR}race"],
        )
        assert await cur.fetchone() == (60, 60, 0, 59)
    ids, cursors = await page_all(index(), limit=7, namespace="race")
    assert sorted(ids) == sorted(f"w{n}-{j}" for n in range(12) for j in range(5))
    assert cursors == [str(p) for p in range(7, 60, 7)]


async def test_the_cursors_given_before_places_were_counted_per_namespace_still_page_on(index, pool):
    """Rows placed by the table's sequence (a namespace registered before migration 0020,
    next_seq NULL) keep their places; a cursor of the form given then (the last place
    returned, base64) continues after it; new rows come after the last old one."""
    ix = index()
    await ix.upsert(vectors=[(f"old-{i}", [1.0, float(i)]) for i in range(8)], namespace="legacy")
    stored = f"dense{NAMESPACE_SEPARATOR}legacy"
    async with pool.connection() as conn:
        await conn.execute("UPDATE dw_index_documents SET seq = seq + 1000 WHERE namespace = %s", [stored])
        await conn.execute("UPDATE dw_index_namespaces SET next_seq = NULL WHERE namespace = %s", [stored])
    old_cursor = encode_cursor("1004")  # after old-4, as Range gave it before
    page = await ix.range(cursor=old_cursor, limit=2, namespace="legacy")
    assert [v.id for v in page.vectors] == ["old-5", "old-6"] and page.next_cursor == "1007"
    await ix.upsert(vectors=[("new-0", [1.0, 0.5]), ("old-2", [2.0, 0.0])], namespace="legacy")
    ids, cursors = await page_all(ix, limit=3, namespace="legacy", cursor=page.next_cursor)
    assert ids == ["old-7", "new-0"] and cursors == []
    ids, cursors = await page_all(ix, limit=3, namespace="legacy")
    assert ids == [*(f"old-{i}" for i in range(8)), "new-0"] and cursors == ["1003", "1006"]


@pytest.mark.parametrize("cursor", ["abc", "-1", "1.5", encode_cursor("id-1"), str(2**63)])
async def test_a_cursor_no_range_gave_is_refused(index, cursor):
    from upstash_vector.errors import UpstashError

    with pytest.raises(UpstashError, match="cursor"):
        await index().range(cursor=cursor, limit=5)
