"""Sweep test harness (tests/sweep): a Sweeper over the test schema and the fake embedder,
a controllable clock, and readers of what the sweep wrote."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.db.events import ELIGIBLE_DECISIONS, ELIGIBLE_EVENT_TYPE
from dwsearch.redaction import REDACTION_ON
from dwsearch.sweep.admin import SweepAdmin
from dwsearch.sweep.sweeper import Sweeper, SweepOptions, SweepProgress
from dwsearch.sweep.window import Message, plan_windows
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch_testkit.fakes import FAKE_MODEL, FakeEmbedder

ORG = "org-a"
PROVIDER = "whatsapp"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
# Far enough after any test event that every session has ended.
LATER = T0 + timedelta(days=30)


@dataclass
class SweepFakeEmbedder(FakeEmbedder):
    """The fake embedder, with injected failures reaching Embed only unless
    `fail_count_tokens` (a chunk's full text is also its last CountTokens prefix), and a
    hook run inside every Embed call."""

    fail_count_tokens: bool = False
    on_embed: Callable[[], Awaitable[None]] | None = None

    async def CountTokens(self, request, context):
        if self.fail_count_tokens:
            return await super().CountTokens(request, context)
        await self._model(request, context)
        return pb.CountTokensResponse(
            token_counts=[self.count(t) for t in request.inputs], max_input_tokens=self.max_input_tokens
        )

    async def Embed(self, request, context):
        if self.on_embed is not None:
            await self.on_embed()
        return await super().Embed(request, context)


@dataclass
class Clock:
    now: datetime = LATER

    def __call__(self) -> datetime:
        return self.now


async def sweep_once(sweeper: Sweeper, **options: object) -> SweepProgress:
    """Run a sweep to its summary."""
    last = None
    async for progress in sweeper.sweep(SweepOptions(**options)):
        last = progress
    assert last is not None and last.done
    return last


@dataclass
class Harness:
    url: str
    pool: AsyncConnectionPool
    embedder: EmbedderClient
    fake: SweepFakeEmbedder
    clock: Clock = field(default_factory=Clock)

    def sweeper(self, *, model: str = FAKE_MODEL, **kw: object) -> Sweeper:
        kw.setdefault("redaction", REDACTION_ON)
        return Sweeper(self.pool, self.embedder, model=model, clock=self.clock, **kw)

    def admin(self, *, model: str = FAKE_MODEL) -> SweepAdmin:
        """Status, Purge, Forget and RetryPoison over the harness's database."""
        return SweepAdmin(self.pool, model=model, clock=self.clock)

    async def sweep(self, **options: object) -> SweepProgress:
        return await sweep_once(self.sweeper(), **options)

    def insert(
        self,
        channel: str,
        messages: Iterable[tuple[float, str]],
        *,
        org: str = ORG,
        decision: str = "received",
        event_type: str = "message",
    ) -> list[str]:
        """Insert (minutes after T0, text) messages into a channel, in one transaction (as
        the Go module's inserts, but faster than one commit each); return their ids."""
        with psycopg.connect(self.url) as conn:
            return [
                conn.execute(
                    """INSERT INTO dw_chat_events
                       (org_id, provider, external_channel_id, event_type, decision, message_text, created_at)
                       VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id::text""",
                    (org, PROVIDER, channel, event_type, decision, text, T0 + timedelta(minutes=m)),
                ).fetchone()[0]
                for m, text in messages
            ]

    def query(self, query: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(query, params).fetchall()

    def embedded(self, model: str = FAKE_MODEL, org: str = ORG) -> list[tuple[str, ...]]:
        """Source ids of the embedded windows, in time order."""
        rows = self.query(
            """SELECT source_message_ids FROM dw_message_embeddings WHERE model = %s AND org_id = %s
               ORDER BY external_channel_id, window_start""",
            (model, org),
        )
        return [tuple(ids) for (ids,) in rows]

    def finished(self, model: str = FAKE_MODEL) -> dict[tuple[str, ...], str]:
        """Every finished window's source ids and status."""
        rows = self.query(
            "SELECT source_message_ids::text[], status FROM dw_sweep_windows WHERE model = %s", (model,)
        )
        return {tuple(ids): status for ids, status in rows}

    def watermark(self, channel: str, model: str = FAKE_MODEL, org: str = ORG) -> tuple | None:
        rows = self.query(
            """SELECT last_event_id::text, consecutive_failures, last_error FROM dw_sweep_watermarks
               WHERE org_id = %s AND provider = %s AND external_channel_id = %s AND model = %s""",
            (org, PROVIDER, channel, model),
        )
        return rows[0] if rows else None

    async def expected(self, *, org: str = ORG, now: datetime = LATER) -> set[tuple[str, ...]]:
        """The windows the pure windowing function computes over the current events."""
        # -infinity: a retention lock's row (dwsearch.sweep.store.keys.lock_org), no cutoff
        cutoff = self.query(
            "SELECT cutoff FROM dw_sweep_retention WHERE org_id = %s AND cutoff > '-infinity'", (org,)
        )
        rows = self.query(
            """SELECT external_channel_id, id::text, created_at, message_text FROM dw_chat_events
               WHERE org_id = %s AND event_type = %s AND decision = ANY(%s) AND created_at >= %s
               ORDER BY external_channel_id, created_at, id""",
            (
                org,
                ELIGIBLE_EVENT_TYPE,
                list(ELIGIBLE_DECISIONS),
                cutoff[0][0] if cutoff else datetime.min.replace(tzinfo=UTC),
            ),
        )
        sweeper = self.sweeper()
        by_channel: dict[str, list[Message]] = {}
        for channel, event_id, created_at, text in rows:
            by_channel.setdefault(channel, []).append(Message(event_id, created_at, sweeper.line(text)))

        async def count(texts):
            return [self.fake.count(t) for t in texts]

        out = set()
        for messages in by_channel.values():
            async for w in plan_windows(
                messages, now=now, max_tokens=self.fake.max_input_tokens, count_tokens=count
            ):
                out.add(w.ids)
        return out


def words(n: int, tag: str = "w") -> str:
    """A message of n distinct words (n fake tokens + 2)."""
    return " ".join(f"{tag}{i}" for i in range(n))
