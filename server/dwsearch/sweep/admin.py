"""SweepService's operations besides Sweep: Status, Purge, Forget and RetryPoison, each
one request to the store."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from dwsearch.common import metrics, offload
from dwsearch.common.errors import InvalidArgument
from dwsearch.flags import enabled_orgs
from dwsearch.sweep.forget import parse_message_ids
from dwsearch.sweep.store import discovery, retention, status, writes
from dwsearch.sweep.store.status import PoisonRow, WatermarkRow

log = logging.getLogger(__name__)

FORGET_ID_COST = 32
"""Forget's ids in characters of text (the unit of offload.INLINE_MAX_SIZE): up to 512
ids are parsed inline."""


@dataclass(frozen=True)
class SweepStatus:
    model: str
    watermarks: list[WatermarkRow]
    poison: list[PoisonRow]
    embedded_windows: int
    pending_events: int
    unswept_events: int = 0
    unswept_oldest: datetime | None = None


def _utcnow() -> datetime:
    return datetime.now(UTC)


class SweepAdmin:
    """`model`: the model Status reports when asked for none (the default model)."""

    def __init__(
        self, pool: AsyncConnectionPool, *, model: str, clock: Callable[[], datetime] = _utcnow
    ) -> None:
        self.pool = pool
        self.model = model
        self.clock = clock

    async def status(self, org_id: str = "", model: str = "") -> SweepStatus:
        model = model or self.model
        async with self.pool.connection() as conn:
            marks = await status.watermarks(conn, model, org_id)
            orgs = [org for org in await enabled_orgs(conn) if not org_id or org == org_id]
            unswept, unswept_oldest = await status.unwatermarked_pending(conn, model, orgs)
            poison = await status.poison_windows(conn, model, org_id)
            embedded = await status.embedded_windows(conn, model, org_id)
        return SweepStatus(
            model=model,
            watermarks=marks,
            poison=poison,
            embedded_windows=embedded,
            pending_events=sum(m.pending for m in marks) + unswept,
            unswept_events=unswept,
            unswept_oldest=unswept_oldest,
        )

    async def purge(self, org_id: str, cutoff: datetime) -> tuple[int, int]:
        """Delete the org's embeddings (every model) whose window includes an event before
        `cutoff`, and keep later sweeps from embedding such events."""
        if not org_id.strip():
            raise InvalidArgument("org_id is required")
        if cutoff > self.clock():
            raise InvalidArgument(f"cutoff {cutoff.isoformat()} is in the future")
        async with self.pool.connection() as conn:
            purged = await retention.purge(conn, org_id, cutoff)
            # A window across the cutoff leaves its later events uncovered.
            await discovery.check_again(conn, org_id)
        return purged

    async def forget(self, org_id: str, message_ids: Sequence[str]) -> int:
        """Drop the org's windows (every model) holding any of the messages, now."""
        if not org_id.strip():
            raise InvalidArgument("org_id is required")
        # About 2 us an id: thousands are parsed off the event loop.
        ids = await offload.run(parse_message_ids, message_ids, size=FORGET_ID_COST * len(message_ids))
        async with self.pool.connection() as conn:
            dropped = await retention.drop_windows_holding(conn, org_id, ids)
            if dropped:  # their other events are uncovered now
                await discovery.check_again(conn, org_id)
        if dropped:
            metrics.SWEEP_WINDOWS_DROPPED.inc(dropped)
            log.info("forgot windows", extra={"org_id": org_id, "windows": dropped})
        return dropped

    async def retry_poison(self, org_id: str = "", ids: Sequence[str] = ()) -> int:
        try:
            uuids = [UUID(i) for i in ids]
        except ValueError:
            raise InvalidArgument("ids must be poison window ids (UUIDs)") from None
        async with self.pool.connection() as conn:
            released = await writes.release_poison(conn, org_id, uuids)
            if released:  # their events are uncovered now
                await discovery.check_again(conn, org_id)
        return released
