"""Conversation windows (docs/design.md, "Windows"): the unit the sweep
embeds, as pure functions over one key's messages.

A key is (org_id, provider, external_channel_id): windows never cross channels or
providers. Its eligible events (`event_type='message' AND decision IN ('received',
'processed')`) are ordered by (created_at, id). A new session starts after a gap of
SESSION_GAP or more. A session is cut, greedily from its first message, into windows of at
most MAX_WINDOW_MESSAGES messages whose chunk text fits the model's input limit, counted
with the model's own tokenizer (the embedder's CountTokens) on the text exactly as it will
be embedded; a single message over the limit forms a window alone and is embedded
truncated, never dropped. A capped session continues in the next window; windows never
overlap.

A window is CLOSED, and only then embedded, when its session has ended — the next message
is SESSION_GAP or more later, or `now` is SESSION_GAP or more after its last message — or
when it was capped (message cap, token cap, or one over-long message). Any other window is
OPEN and waits.

Chunk text, the `content` stored with the vector and what search shows: the window's
messages in (created_at, id) order, one line per message, so line i is
source_message_ids[i]. A message's own line breaks become spaces and surrounding whitespace
is stripped (a blank message is a blank line). No sender roles or timestamps: the events
carry no reliable role (`decision` is a triage outcome, not a direction) and raw text is
what is embedded (docs/design.md, "Purpose"). PII is redacted first when redaction is on
(dwsearch.redaction).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

SESSION_GAP = timedelta(minutes=30)
MAX_WINDOW_MESSAGES = 15

# Token counts of texts, with the model's tokenizer, as Embed would see them.
TokenCounter = Callable[[Sequence[str]], Awaitable[Sequence[int]]]

_LINE_BREAKS = re.compile(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+")


@dataclass(frozen=True)
class Message:
    """One eligible event; `line` is its chunk line (redacted when redaction is on);
    `digest` the md5 of its message_text, kept in the ledger to notice a later edit."""

    id: str
    created_at: datetime
    line: str
    digest: str = field(default="", compare=False)


@dataclass(frozen=True)
class Window:
    messages: tuple[Message, ...]
    text: str
    token_count: int
    # Closed because its session ended (rather than by a cap).
    ends_session: bool
    # One message over the model's input limit: embedded truncated.
    over_limit: bool

    @property
    def start(self) -> datetime:
        return self.messages[0].created_at

    @property
    def end(self) -> datetime:
        return self.messages[-1].created_at

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.messages)


def chunk_line(text: str) -> str:
    """A message as one line of chunk text."""
    return _LINE_BREAKS.sub(" ", text).strip()


def chunk_text(lines: Sequence[str]) -> str:
    return "\n".join(lines)


def session_starts(messages: Sequence[Message]) -> list[int]:
    """Indexes where a session starts: the first message and each one after a gap."""
    return [
        i
        for i, m in enumerate(messages)
        if i == 0 or m.created_at - messages[i - 1].created_at >= SESSION_GAP
    ]


def session_start(messages: Sequence[Message], index: int) -> int:
    """Index of the first message of the session that messages[index] belongs to."""
    while index > 0 and messages[index].created_at - messages[index - 1].created_at < SESSION_GAP:
        index -= 1
    return index


def fitting_prefix(prefix_tokens: Sequence[int], max_tokens: int) -> int:
    """How many messages the window takes: the longest prefix within the limit, at least
    one (an over-long single message is embedded truncated)."""
    n = 1
    for i, tokens in enumerate(prefix_tokens[1:], start=2):
        if tokens > max_tokens:
            break
        n = i
    return n


async def plan_windows(
    messages: Sequence[Message], *, now: datetime, max_tokens: int, count_tokens: TokenCounter
) -> AsyncIterator[Window]:
    """The closed windows of `messages`, in order, stopping at the first open one.

    `messages` are one key's eligible messages in (created_at, id) order, starting at a
    window boundary (a session start or the end of a capped window). Each window costs one
    CountTokens call, or two when the token limit cuts it.
    """
    starts = session_starts(messages)
    session_ends = [*starts[1:], len(messages)]
    session = 0
    i = 0
    while i < len(messages):
        while session_ends[session] <= i:
            session += 1
        end_of_session = session_ends[session]
        candidates = messages[i : min(end_of_session, i + MAX_WINDOW_MESSAGES)]
        prefixes = [chunk_text([m.line for m in candidates[: k + 1]]) for k in range(len(candidates))]
        # Chat windows mostly fit whole: count that text alone, and every prefix only
        # when it does not (tokenizing the prefixes costs ~MAX_WINDOW_MESSAGES/2 times more).
        (whole,) = await _count(prefixes[-1:], count_tokens)
        if whole <= max_tokens:
            n, tokens = len(candidates), whole
        else:
            prefix_tokens = [*await _count(prefixes[:-1], count_tokens), whole]
            n = fitting_prefix(prefix_tokens, max_tokens)
            tokens = prefix_tokens[n - 1]
        window_messages = tuple(candidates[:n])
        over_limit = tokens > max_tokens  # one message alone over the limit
        follows = i + n
        session_over = follows == end_of_session and (
            follows < len(messages) or now - window_messages[-1].created_at >= SESSION_GAP
        )
        capped = follows < end_of_session or n == MAX_WINDOW_MESSAGES or over_limit
        if not (session_over or capped):
            return
        yield Window(
            messages=window_messages,
            text=prefixes[n - 1],
            token_count=tokens,
            ends_session=session_over,
            over_limit=over_limit,
        )
        i = follows


async def _count(texts: list[str], count_tokens: TokenCounter) -> list[int]:
    # Embedders reject empty inputs; an empty prefix (a blank first message) has no tokens
    # that matter against the limit.
    asked = [t for t in texts if t]
    counts = iter(await count_tokens(asked)) if asked else iter(())
    return [next(counts) if t else 0 for t in texts]
