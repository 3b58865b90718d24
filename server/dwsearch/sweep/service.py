"""SweepService servicer: protobuf in, Sweeper, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.duration_pb2 import Duration

from dwsearch.common.errors import InvalidArgument, ResourceExhausted
from dwsearch.common.fields import MAX_MODEL_BYTES, check_length, check_org_id, distinct_ids
from dwsearch.common.wire import to_datetime, to_seconds, to_timestamp
from dwsearch.sweep.admin import SweepAdmin
from dwsearch.sweep.store.status import PoisonRow, WatermarkRow
from dwsearch.sweep.sweeper import ModelProgress, Sweeper, SweepOptions, SweepProgress
from dwsearch.v1 import sweep_pb2 as pb
from dwsearch.v1 import sweep_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    pass

SERVICE_NAME = "dwsearch.v1.SweepService"
# Sweeps one server runs at once (DWSEARCH_MAX_CONCURRENT_SWEEPS); more are refused with
# RESOURCE_EXHAUSTED before they touch the database.
MAX_CONCURRENT_SWEEPS = 2


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromTimedelta(timedelta(seconds=max(seconds, 0.0)))
    return d


def _model_to_pb(m: ModelProgress) -> pb.ModelSweep:
    return pb.ModelSweep(
        model=m.model,
        windows_embedded=m.windows_embedded,
        windows_skipped=m.windows_skipped,
        windows_poisoned=m.windows_poisoned,
        keys_total=m.keys_total,
        keys_done=m.keys_done,
        keys_stalled=m.keys_stalled,
        keys_locked=m.keys_locked,
        events_pending=m.events_pending,
        events_processed=m.events_processed,
        error=m.error,
    )


def progress_to_pb(p: SweepProgress) -> pb.SweepResponse:
    return pb.SweepResponse(
        windows_embedded=p.windows_embedded,
        windows_skipped=p.windows_skipped,
        windows_poisoned=p.windows_poisoned,
        windows_dropped=p.windows_dropped,
        keys_total=p.keys_total,
        keys_done=p.keys_done,
        keys_stalled=p.keys_stalled,
        keys_locked=p.keys_locked,
        events_pending=p.events_pending,
        events_processed=p.events_processed,
        budget_exhausted=p.budget_exhausted,
        model=p.model,
        elapsed=_duration(p.elapsed),
        stalled=[
            pb.StalledKey(
                org_id=s.key.org_id,
                provider=s.key.provider,
                external_channel_id=s.key.external_channel_id,
                error=s.error,
                model=s.model,
            )
            for s in p.stalled
        ],
        done=p.done,
        orgs_skipped=[pb.SkippedOrg(org_id=org, reason=reason) for org, reason in p.orgs_skipped],
        models=[_model_to_pb(m) for m in p.models],
    )


def _watermark_to_pb(w: WatermarkRow, now: datetime) -> pb.Watermark:
    msg = pb.Watermark(
        org_id=w.key.org_id,
        provider=w.key.provider,
        external_channel_id=w.key.external_channel_id,
        model=w.model,
        updated_at=to_timestamp(w.updated_at),
        pending_events=w.pending,
        lag=_duration((now - w.oldest_pending).total_seconds() if w.oldest_pending else 0.0),
        consecutive_failures=w.consecutive_failures,
        last_error=w.last_error,
    )
    if w.position is not None:
        msg.last_event_time.CopyFrom(to_timestamp(w.position.created_at))
        msg.last_event_id = w.position.id
    return msg


def _poison_to_pb(p: PoisonRow) -> pb.PoisonWindow:
    return pb.PoisonWindow(
        id=p.id,
        org_id=p.key.org_id,
        provider=p.key.provider,
        external_channel_id=p.key.external_channel_id,
        model=p.model,
        window_start=to_timestamp(p.window_start),
        window_end=to_timestamp(p.window_end),
        source_message_ids=list(p.source_message_ids),
        error=p.error,
        attempts=p.attempts,
        created_at=to_timestamp(p.created_at),
    )


class SweepService(pb_grpc.SweepServiceServicer):
    def __init__(
        self, sweeper: Sweeper, admin: SweepAdmin, *, max_concurrent: int = MAX_CONCURRENT_SWEEPS
    ) -> None:
        self.sweeper = sweeper
        self.admin = admin
        self.max_concurrent = max(1, max_concurrent)
        self.running = 0

    async def Sweep(
        self, request: pb.SweepRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.SweepResponse]:
        max_duration = None
        if request.HasField("max_duration"):
            seconds = to_seconds(request.max_duration, "max_duration")
            if seconds < 0:
                raise InvalidArgument("max_duration must not be negative")
            max_duration = seconds or None
        check_org_id(request.org_id)
        options = SweepOptions(
            org_id=request.org_id, max_windows=request.max_windows, max_duration=max_duration
        )
        # Each sweep holds pooled connections (its key locks) for as long as it runs: a
        # flood of Sweep calls must not take the pool from Search.
        if self.running >= self.max_concurrent:
            raise ResourceExhausted(
                f"{self.running} sweeps are already running on this server (DWSEARCH_MAX_CONCURRENT_SWEEPS="
                f"{self.max_concurrent}); retry when one has finished"
            )
        self.running += 1
        try:
            async for progress in self.sweeper.sweep(options):
                yield progress_to_pb(progress)
        finally:
            self.running -= 1

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.StatusResponse:
        check_org_id(request.org_id)
        check_length(request.model, "model", MAX_MODEL_BYTES)
        status = await self.admin.status(request.org_id, request.model)
        now = datetime.now(UTC)
        return pb.StatusResponse(
            model=status.model,
            watermarks=[_watermark_to_pb(w, now) for w in status.watermarks],
            poison_windows=[_poison_to_pb(p) for p in status.poison],
            embedded_windows=status.embedded_windows,
            pending_events=status.pending_events,
            unswept_events=status.unswept_events,
            unswept_lag=_duration(
                (now - status.unswept_oldest).total_seconds() if status.unswept_oldest else 0.0
            ),
        )

    async def Purge(
        self, request: pb.PurgeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PurgeResponse:
        if not request.HasField("cutoff"):
            raise InvalidArgument("cutoff is required")
        check_org_id(request.org_id)
        embeddings, poison = await self.admin.purge(request.org_id, to_datetime(request.cutoff, "cutoff"))
        return pb.PurgeResponse(embeddings_deleted=embeddings, poison_windows_deleted=poison)

    async def Forget(
        self, request: pb.ForgetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ForgetResponse:
        check_org_id(request.org_id)
        dropped = await self.admin.forget(request.org_id, list(request.message_ids))
        return pb.ForgetResponse(windows_dropped=dropped)

    async def RetryPoison(
        self, request: pb.RetryPoisonRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RetryPoisonResponse:
        check_org_id(request.org_id)
        # Repeats dropped and the rest counted before any id is parsed.
        released = await self.admin.retry_poison(request.org_id, distinct_ids(request.ids, "ids"))
        return pb.RetryPoisonResponse(windows_released=released)
