"""Windowing, chunk text and the substance filter: pure functions, no database."""

from datetime import UTC, datetime, timedelta

import pytest

from dwsearch.sweep.keyrun import POISON_AFTER_FAILURES
from dwsearch.sweep.substance import SUBSTANCE_MIN_CHARS, is_substantial, meaningful_chars
from dwsearch.sweep.window import (
    MAX_WINDOW_MESSAGES,
    SESSION_GAP,
    Message,
    chunk_line,
    chunk_text,
    fitting_prefix,
    plan_windows,
    session_starts,
)

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
LIMIT = 512


def msgs(*spec: tuple[float, str]) -> list[Message]:
    """Messages from (minutes after T0, text)."""
    return [
        Message(f"m{i:03d}", T0 + timedelta(minutes=m), chunk_line(text)) for i, (m, text) in enumerate(spec)
    ]


def every_minute(n: int, text: str = "hello there") -> list[Message]:
    return msgs(*[(i, f"{text} {i}") for i in range(n)])


class Counter:
    """Fake tokenizer: whitespace tokens + 2 (like CLS/SEP); records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def __call__(self, texts):
        self.asked.append(list(texts))
        return [len(t.split()) + 2 for t in texts]


async def windows(messages, *, now, max_tokens=LIMIT, counter=None):
    counter = counter or Counter()
    return [w async for w in plan_windows(messages, now=now, max_tokens=max_tokens, count_tokens=counter)]


def ids(ws) -> list[list[str]]:
    return [list(w.ids) for w in ws]


def test_named_constants():
    assert timedelta(minutes=30) == SESSION_GAP
    assert MAX_WINDOW_MESSAGES == 15
    assert SUBSTANCE_MIN_CHARS == 20
    assert POISON_AFTER_FAILURES == 3


def test_session_splits_at_a_gap_of_30_minutes_or_more():
    m = msgs((0, "a"), (29.99, "b"), (59.98, "c"), (89.98, "d"))
    assert session_starts(m) == [0, 3]  # 29m59s joins; exactly 30m splits


async def test_gap_split_makes_separate_windows():
    m = msgs((0, "a"), (10, "b"), (45, "c"), (50, "d"))
    assert ids(await windows(m, now=T0 + timedelta(days=1))) == [["m000", "m001"], ["m002", "m003"]]


async def test_window_is_open_until_its_session_ends():
    m = msgs((0, "a"), (10, "b"))
    assert await windows(m, now=T0 + timedelta(minutes=39)) == []
    (w,) = await windows(m, now=T0 + timedelta(minutes=40))  # "now" 30 minutes after the last message
    assert w.ends_session and w.ids == ("m000", "m001")


async def test_next_message_after_a_gap_closes_the_window_before_it():
    m = msgs((0, "a"), (40, "b"))
    # The second session is still open at 41 minutes; the first closed when "b" came.
    assert ids(await windows(m, now=T0 + timedelta(minutes=41))) == [["m000"]]


async def test_cap_of_15_messages_and_continuation():
    m = every_minute(20)
    ended = await windows(m, now=T0 + timedelta(days=1))
    assert [len(w.messages) for w in ended] == [15, 5]
    assert ids(ended)[0] + ids(ended)[1] == [x.id for x in m]  # no overlap, nothing lost
    # Mid-session the capped window is closed; the continuation waits.
    ongoing = await windows(m, now=m[-1].created_at + timedelta(minutes=1))
    assert ids(ongoing) == [ids(ended)[0]] and not ongoing[0].ends_session


async def test_exactly_15_messages_close_even_while_the_session_goes_on():
    m = every_minute(15)
    (w,) = await windows(m, now=m[-1].created_at + timedelta(minutes=1))
    assert len(w.messages) == MAX_WINDOW_MESSAGES


async def test_token_cap_counts_the_chunk_text_as_embedded():
    m = every_minute(6, "a b c d")  # 5 words each line
    counter = Counter()
    ws = await windows(m, now=T0 + timedelta(days=1), max_tokens=14, counter=counter)
    # "a b c d 0\na b c d 1" is 10 tokens + 2 = 12 <= 14; three lines are 17.
    assert [len(w.messages) for w in ws] == [2, 2, 2]
    assert all(w.token_count <= 14 for w in ws)
    whole = "\n".join(f"a b c d {i}" for i in range(6))
    # The whole candidate text first; its prefixes only because it is over the limit.
    assert counter.asked[:2] == [[whole], [whole.rsplit("\n", k)[0] for k in range(5, 0, -1)]]


async def test_a_window_that_fits_whole_costs_one_count():
    counter = Counter()
    ws = await windows(every_minute(20), now=T0 + timedelta(days=1), counter=counter)
    assert [len(w.messages) for w in ws] == [15, 5]
    assert [len(asked) for asked in counter.asked] == [1, 1]


async def test_token_capped_window_closes_mid_session():
    m = every_minute(3, "a b c d")
    ws = await windows(m, now=m[-1].created_at, max_tokens=14)
    assert ids(ws) == [["m000", "m001"]]  # the third message waits for more


async def test_over_long_message_is_alone_and_never_dropped():
    m = msgs((0, "short one"), (1, " ".join(["long"] * 50)), (2, "after it"))
    ws = await windows(m, now=T0 + timedelta(days=1), max_tokens=20)
    assert ids(ws) == [["m000"], ["m001"], ["m002"]]
    assert [w.over_limit for w in ws] == [False, True, False]
    # Even as the last message of an ongoing session: nothing more could fit.
    (w,) = await windows(m[1:2], now=m[1].created_at, max_tokens=20)
    assert w.over_limit


def test_fitting_prefix():
    assert fitting_prefix([5, 9, 12, 20], 12) == 3
    assert fitting_prefix([30, 40], 12) == 1  # one message at least
    assert fitting_prefix([5], 12) == 1


def test_chunk_text_is_one_line_per_message():
    lines = [chunk_line(t) for t in ["  migrate 那个 ", "Clerk 还是\nBetterAuth?", "", "ok\r\n"]]
    assert chunk_text(lines) == "migrate 那个\nClerk 还是 BetterAuth?\n\nok"
    assert len(chunk_text(lines).split("\n")) == 4  # line i is source_message_ids[i]


async def test_blank_first_message_is_not_sent_to_the_tokenizer():
    m = msgs((0, "   "), (1, "real words here"))
    counter = Counter()
    (w,) = await windows(m, now=T0 + timedelta(days=1), counter=counter)
    assert counter.asked == [["\nreal words here"]]
    assert w.text == "\nreal words here"


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("ok", 2),
        ("ok 👍👍 !!! ??? ... :) ✓", 2),  # emoji, punctuation, symbols do not count
        ("migrate 那个", 9),  # CJK characters count one each
        ("Boleh tak esok?", 12),
        ("हिन्दी", 3),  # letters count, combining vowel signs and viramas do not
        ("order 12345", 10),  # digits count
        ("[EMAIL]", 5),  # placeholders count as the text embedded
    ],
)
def test_meaningful_chars(text, count):
    assert meaningful_chars(text) == count


@pytest.mark.parametrize(
    ("text", "substantial"),
    [
        ("ok\nthanks\n👍", False),
        ("a" * 19 + " 🙂🙂🙂🙂🙂", False),
        ("a" * 20, True),
        ("migrate 那个\nClerk 还是 BetterAuth?\nBetterAuth", True),  # a trivial line inside a window stays
        ("这个问题我们明天再讨论吧好不好呢朋友们啊", True),
        ("好的\n谢谢", False),
    ],
)
def test_substance_is_judged_on_the_whole_window(text, substantial):
    assert is_substantial(text) is substantial
