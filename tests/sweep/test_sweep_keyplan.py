"""One key's plan over its events and the finished windows covering them: pure, no
database. Late inserts, released poison and confirmations."""

import uuid
from datetime import UTC, datetime, timedelta

from dwsearch.sweep.keyplan import Advance, Finish, KeyEvent, Position, plan_key
from dwsearch.sweep.window import Message

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
LATER = T0 + timedelta(days=1)


async def count(texts):
    return [len(t.split()) + 2 for t in texts]


class Key:
    """Events of one key by name; `finished` assigns covering windows."""

    def __init__(self, **minutes: float) -> None:
        # Ordered ids so that equal timestamps order like Postgres orders uuids.
        self.messages = {
            name: Message(str(uuid.UUID(int=i + 1)), T0 + timedelta(minutes=m), f"text of {name}")
            for i, (name, m) in enumerate(minutes.items())
        }
        self.window_of: dict[str, tuple[str, int]] = {}

    def finished(self, *windows: str) -> None:
        for names in windows:
            wid = f"w-{names}"
            for name in names.split():
                self.window_of[name] = (wid, len(names.split()))

    def events(self) -> list[KeyEvent]:
        ordered = sorted(self.messages.items(), key=lambda kv: (kv[1].created_at, uuid.UUID(kv[1].id)))
        return [KeyEvent(m, *self.window_of.get(name, (None, 0))) for name, m in ordered]

    def pos(self, name: str) -> Position:
        m = self.messages[name]
        return Position(m.created_at, m.id)

    def names(self, ids) -> str:
        by_id = {m.id: n for n, m in self.messages.items()}
        return " ".join(by_id[i] for i in ids)

    async def plan(self, watermark: str | None, now: datetime = LATER) -> list[tuple]:
        steps = plan_key(
            self.events(),
            watermark=self.pos(watermark) if watermark else None,
            now=now,
            max_tokens=512,
            count_tokens=count,
        )
        out = []
        async for s in steps:
            if isinstance(s, Finish):
                out.append(("finish", self.names(s.window.ids), s.replaces))
            else:
                assert isinstance(s, Advance)
                out.append(("advance", self.names([s.position.id]) if s.position else None))
        return out


async def test_backfill_finishes_every_closed_window():
    k = Key(a=0, b=5, c=60, d=61)
    assert await k.plan(None) == [("finish", "a b", ()), ("finish", "c d", ())]


async def test_only_events_after_the_watermark_are_planned():
    k = Key(c=60, d=61)  # what the sweep loads when nothing is uncovered
    k.messages["a"] = Message(str(uuid.UUID(int=99)), T0, "x")
    k.finished("a")
    assert await k.plan("a") == [("finish", "c d", ())]


async def test_late_insert_inside_a_session_replaces_its_window_and_jumps_back():
    k = Key(a=0, b=5, late=7, c=10, d=60, e=61, f=120, g=121)
    k.finished("a b c", "d e", "f g")
    assert await k.plan("g") == [
        ("finish", "a b late c", ("w-a b c",)),
        ("advance", "g"),  # the sessions after it are intact
    ]


async def test_late_insert_in_a_later_session_leaves_earlier_ones_alone():
    k = Key(a=0, b=5, d=60, late=62, e=65, f=120)
    k.finished("a b", "d e", "f")
    assert await k.plan("f") == [("finish", "d late e", ("w-d e",)), ("advance", "f")]


async def test_isolated_late_event_is_a_window_of_its_own():
    k = Key(a=0, late=200, f=400)
    k.finished("a", "f")
    assert await k.plan("f") == [("finish", "late", ()), ("advance", "f")]


async def test_late_event_bridging_two_sessions_merges_them():
    k = Key(a=0, b=20, late=45, c=70, d=80)
    k.finished("a b", "c d")
    assert await k.plan("d") == [("finish", "a b late c d", ("w-a b", "w-c d"))]


async def test_unchanged_windows_are_confirmed_not_embedded_again():
    minutes = {f"a{i:02d}": i for i in range(17)}
    minutes["late"] = 14.5  # after a14: the first window stays as it was
    k = Key(**minutes)
    first = " ".join(f"a{i:02d}" for i in range(15))
    k.finished(first, "a15 a16")
    assert await k.plan("a16") == [("advance", "a14"), ("finish", "late a15 a16", ("w-a15 a16",))]


async def test_late_insert_in_a_capped_ongoing_session_moves_the_watermark_back():
    minutes = {f"a{i:02d}": i for i in range(15)}
    minutes["late"] = 3.5
    k = Key(**minutes)
    k.finished(" ".join(f"a{i:02d}" for i in range(15)))
    now = T0 + timedelta(minutes=15)  # the session goes on
    expected_first = "a00 a01 a02 a03 late " + " ".join(f"a{i:02d}" for i in range(4, 14))
    # The 15-message window is re-cut; a14 now waits in the open window after it.
    assert await k.plan("a14", now) == [
        ("finish", expected_first, ("w-" + " ".join(f"a{i:02d}" for i in range(15)),))
    ]


async def test_released_poison_window_is_swept_again():
    k = Key(a=0, b=1, c=60, d=61, e=120)
    k.finished("a b", "e")  # "c d" was poison; RetryPoison deleted it
    assert await k.plan("e") == [("finish", "c d", ()), ("advance", "e")]


async def test_rewind_to_an_open_window_moves_the_watermark_back():
    # The ledger lost "a" (e.g. a window cut by a purge) while its session is still open.
    k = Key(a=0, b=1)
    k.finished("b")
    assert await k.plan("b", now=T0 + timedelta(minutes=2)) == [("advance", None)]


async def test_event_after_the_watermark_reopens_a_window_the_clock_closed():
    k = Key(a=0, b=5, c=20)  # "a b" was closed at 35+ minutes; "c" then arrived, dated 20
    k.finished("a b")
    assert await k.plan("b") == [("finish", "a b c", ("w-a b",))]


async def test_a_window_closed_by_its_cap_is_not_reopened():
    minutes = {f"a{i:02d}": i for i in range(16)}
    k = Key(**minutes)
    k.finished(" ".join(f"a{i:02d}" for i in range(15)))
    assert await k.plan("a14") == [("finish", "a15", ())]


async def test_reopened_window_after_a_repaired_session():
    k = Key(a=0, late=1, b=2, x=40, c=80, d=90, e=100)
    k.finished("a b", "x", "c d")
    assert await k.plan("d") == [
        ("finish", "a late b", ("w-a b",)),
        ("advance", "x"),  # jump over the intact session to the reopened window, not past it
        ("finish", "c d e", ("w-c d",)),
    ]
