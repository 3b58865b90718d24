"""`dwsearch sweep`, `purge`, `forget`, `sweep-status` and `retry-poison`: clients of SweepService,
what the Kubernetes CronJob, the retention job and an operator run.

`dwsearch sweep` calls Sweep with the deadline DWSEARCH_TIMEOUT_SECONDS, shows a progress
bar on a terminal (stderr is a TTY, or --progress), prints a summary and exits:
- 0 when the sweep ran, stalled keys included — their watermarks wait for the next run,
  which is how a transient failure is retried; each is printed as a warning;
- 1 when the call failed (any RPC error: embedder serving another model, database or
  server unreachable, deadline passed) or ended without its summary;
- 3 when keys stalled and nothing else moved: no window finished and no key caught up
  (e.g. the embedder rejects every call), so the CronJob shows up as failing.

`dwsearch sweep-status` prints the backlog, the keys behind or failing and the poison
windows; it exits 3 when a key lags more than --max-lag or, with --fail-on-poison, when
poison windows exist, so a monitoring CronJob can run it. `dwsearch retry-poison`
releases poison windows for the next sweep. `dwsearch forget` drops the windows holding
given messages (after they were deleted or edited); it exits 2 on ids it would not send.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToJson
from google.protobuf.timestamp_pb2 import Timestamp
from tqdm import tqdm

from dwsearch.clients.channel import auth_metadata, dial
from dwsearch.common import tracing
from dwsearch.common.config import ClientConfig
from dwsearch.common.errors import InvalidArgument
from dwsearch.common.tls import client_tls
from dwsearch.sweep.forget import parse_message_ids
from dwsearch.v1 import sweep_pb2 as pb
from dwsearch.v1 import sweep_pb2_grpc as pb_grpc

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ALL_STALLED = 3
EXIT_UNHEALTHY = 3  # sweep-status: a threshold was crossed

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

R = TypeVar("R")


def run_sweep_command(cfg: ClientConfig, args: argparse.Namespace) -> int:
    show = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    request = pb.SweepRequest(org_id=args.org_id or "", max_windows=max(int(args.max_windows or 0), 0))
    if args.max_duration and args.max_duration > 0:
        request.max_duration.CopyFrom(_duration(args.max_duration))
    with tracing.span("dwsearch sweep", org_id=request.org_id or None):  # the run's one trace
        return asyncio.run(_sweep(cfg, request, show))


def run_purge_command(cfg: ClientConfig, args: argparse.Namespace) -> int:
    try:
        cutoff = parse_cutoff(args.cutoff, now=datetime.now(UTC))
    except ValueError as exc:
        print(f"purge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with tracing.span("dwsearch purge", org_id=args.org_id or None):
        return asyncio.run(_purge(cfg, args.org_id, cutoff))


def parse_age(text: str) -> timedelta:
    """An age such as 30d, 12h, 90m, 45s or 2w."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an age like 30d, 12h or 90m")
    return timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})


def parse_cutoff(text: str, *, now: datetime) -> datetime:
    """An ISO 8601 time (UTC when it names no zone), or an age such as 30d, 12h, 90m."""
    if _DURATION.match(text):
        return now - parse_age(text)
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"cutoff {text!r} is neither an ISO 8601 time nor an age like 30d") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _channel(cfg: ClientConfig) -> grpc.aio.Channel:
    return dial(cfg.server_addr, client_tls(cfg.tls_ca, cfg.tls_client_cert, cfg.tls_client_key))


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromTimedelta(timedelta(seconds=seconds))
    return d


async def _sweep(cfg: ClientConfig, request: pb.SweepRequest, show_progress: bool) -> int:
    summary = None
    bar = tqdm(
        total=0, unit="msg", desc="sweep", file=sys.stderr, disable=not show_progress, dynamic_ncols=True
    )
    try:
        async with _channel(cfg) as channel:
            stub = pb_grpc.SweepServiceStub(channel)
            call = stub.Sweep(request, timeout=cfg.timeout_seconds, metadata=auth_metadata(cfg.auth_token))
            async for progress in call:
                _update(bar, progress)
                if progress.done:
                    summary = progress
    except grpc.aio.AioRpcError as exc:
        bar.close()
        print(f"sweep failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_FAILED
    bar.close()
    if summary is None:
        print("sweep failed: the server ended the call without a summary", file=sys.stderr)
        return EXIT_FAILED
    print(_summary(summary))
    if summary.stalled:
        print(
            f"warning: {summary.keys_stalled} key(s) stalled; their watermarks wait for the next sweep:",
            file=sys.stderr,
        )
        for key in summary.stalled:
            model = f" ({key.model})" if len(summary.models) > 1 else ""
            print(
                f"  {key.org_id}/{key.provider}/{key.external_channel_id}{model}: {key.error}",
                file=sys.stderr,
            )
    finished = summary.windows_embedded + summary.windows_skipped + summary.windows_poisoned
    if summary.keys_stalled and not finished and not summary.keys_done:
        print("sweep failed: every key it tried stalled", file=sys.stderr)
        return EXIT_ALL_STALLED
    return EXIT_OK


def _update(bar: tqdm[Any], progress: pb.SweepResponse) -> None:
    if bar.disable:
        return
    bar.total = progress.events_pending
    bar.n = progress.events_processed
    bar.set_postfix(
        embedded=progress.windows_embedded,
        skipped=progress.windows_skipped,
        poisoned=progress.windows_poisoned,
        stalled=progress.keys_stalled,
        refresh=False,
    )
    bar.refresh()


def _summary(p: pb.SweepResponse) -> str:
    elapsed = p.elapsed.ToTimedelta().total_seconds()
    text = (
        f"sweep done in {elapsed:.1f}s (model {p.model}): {p.windows_embedded} windows embedded, "
        f"{p.windows_skipped} skipped, {p.windows_poisoned} poisoned; "
        f"{p.events_processed} of {p.events_pending} pending events; "
        f"keys: {p.keys_total} with work, {p.keys_done} caught up, {p.keys_stalled} stalled, "
        f"{p.keys_locked} left to another sweeper"
    )
    if p.windows_dropped:
        text += f"; {p.windows_dropped} windows dropped (an event in them was deleted, edited or became ineligible)"
    if p.budget_exhausted:
        text += "; budget exhausted, the rest waits for the next sweep"
    for org in p.orgs_skipped:
        text += f"\norg {org.org_id} not swept: semantic search is off ({org.reason})"
    if p.orgs_skipped and not p.keys_total:
        text += '\nnothing to sweep: semantic search is off for these orgs; README "Feature flags" says how to turn it on'
    if len(p.models) > 1 or any(m.error for m in p.models):
        for m in p.models:
            if m.error:
                text += f"\nmodel {m.model} not swept: {m.error}"
            else:
                text += (
                    f"\nmodel {m.model}: {m.windows_embedded} windows embedded, {m.windows_skipped} skipped, "
                    f"{m.windows_poisoned} poisoned; keys: {m.keys_total} with work, {m.keys_done} caught up, "
                    f"{m.keys_stalled} stalled"
                )
    return text


async def _purge(cfg: ClientConfig, org_id: str, cutoff: datetime) -> int:
    ts = Timestamp()
    ts.FromDatetime(cutoff)
    try:
        async with _channel(cfg) as channel:
            stub = pb_grpc.SweepServiceStub(channel)
            response = await stub.Purge(
                pb.PurgeRequest(org_id=org_id, cutoff=ts),
                timeout=cfg.timeout_seconds,
                metadata=auth_metadata(cfg.auth_token),
            )
    except grpc.aio.AioRpcError as exc:
        print(f"purge failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"purged org {org_id} before {cutoff.isoformat()}: {response.embeddings_deleted} embeddings, "
        f"{response.poison_windows_deleted} poison windows deleted"
    )
    return EXIT_OK


def run_status_command(cfg: ClientConfig, args: argparse.Namespace) -> int:
    try:
        max_lag = parse_age(args.max_lag) if args.max_lag else None
    except ValueError as exc:
        print(f"sweep-status: --max-lag: {exc}", file=sys.stderr)
        return EXIT_USAGE
    request = pb.StatusRequest(org_id=args.org_id or "", model=args.model or "")
    response = asyncio.run(_call(cfg, "sweep-status", lambda stub, **kw: stub.Status(request, **kw)))
    if response is None:
        return EXIT_FAILED
    if args.json:
        print(
            MessageToJson(
                response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
        )
    else:
        print(format_status(response, show_all=args.all))
    unhealthy = False
    if max_lag is not None:
        lagging = [w for w in response.watermarks if w.lag.ToTimedelta() > max_lag]
        if lagging:
            print(f"unhealthy: {len(lagging)} key(s) lag more than {args.max_lag}", file=sys.stderr)
        if response.unswept_lag.ToTimedelta() > max_lag:
            print(
                f"unhealthy: {response.unswept_events} events of keys no sweep has reached, the oldest "
                f"{_age(response.unswept_lag)} old (more than {args.max_lag})",
                file=sys.stderr,
            )
        unhealthy = bool(lagging) or response.unswept_lag.ToTimedelta() > max_lag
    if args.fail_on_poison and response.poison_windows:
        print(f"unhealthy: {len(response.poison_windows)} poison window(s)", file=sys.stderr)
        unhealthy = True
    return EXIT_UNHEALTHY if unhealthy else EXIT_OK


def run_retry_poison_command(cfg: ClientConfig, args: argparse.Namespace) -> int:
    request = pb.RetryPoisonRequest(org_id=args.org_id or "", ids=args.id or [])
    response = asyncio.run(_call(cfg, "retry-poison", lambda stub, **kw: stub.RetryPoison(request, **kw)))
    if response is None:
        return EXIT_FAILED
    print(f"released {response.windows_released} poison window(s); the next sweep tries them again")
    return EXIT_OK


def run_forget_command(cfg: ClientConfig, args: argparse.Namespace) -> int:
    try:
        parse_message_ids(args.message_ids)
    except InvalidArgument as exc:
        print(f"forget: {exc}", file=sys.stderr)
        return EXIT_USAGE
    request = pb.ForgetRequest(org_id=args.org_id, message_ids=args.message_ids)
    response = asyncio.run(_call(cfg, "forget", lambda stub, **kw: stub.Forget(request, **kw)))
    if response is None:
        return EXIT_FAILED
    print(
        f"dropped {response.windows_dropped} window(s) holding those messages; "
        "the next sweep windows what remains of them"
    )
    return EXIT_OK


async def _call(cfg: ClientConfig, name: str, call: Callable[..., Awaitable[R]]) -> R | None:
    """One unary SweepService call; None (the error printed) when it fails."""
    try:
        async with _channel(cfg) as channel:
            stub = pb_grpc.SweepServiceStub(channel)
            return await call(stub, timeout=cfg.timeout_seconds, metadata=auth_metadata(cfg.auth_token))
    except grpc.aio.AioRpcError as exc:
        print(f"{name} failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return None


def _age(value: Duration) -> str:
    """A lag as 3d4h, 2h05m, 7m30s or 45s; '-' when caught up."""
    seconds = int(value.ToTimedelta().total_seconds())
    if seconds <= 0:
        return "-"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_status(r: pb.StatusResponse, *, show_all: bool = False) -> str:
    """The backlog, then the keys behind or failing (every key with show_all), then the
    poison windows."""
    keys = [w for w in r.watermarks if show_all or w.pending_events or w.consecutive_failures]
    keys.sort(
        key=lambda w: (-w.lag.ToTimedelta().total_seconds(), w.org_id, w.provider, w.external_channel_id)
    )
    lines = [
        f"model {r.model}: {r.embedded_windows} embedded windows, {r.pending_events} pending events, "
        f"{len(r.watermarks)} keys with a watermark, {len(r.poison_windows)} poison windows"
    ]
    if r.unswept_events:
        lines.append(
            f"{r.unswept_events} of the pending events belong to keys no sweep has reached yet "
            f"(the oldest {_age(r.unswept_lag)} old)"
        )
    if keys:
        lines.append("")
        lines.append(f"{'KEY':48} {'PENDING':>8} {'LAG':>8} {'FAILS':>5}  LAST ERROR")
        for w in keys:
            key = f"{w.org_id}/{w.provider}/{w.external_channel_id}"
            lines.append(
                f"{key:48} {w.pending_events:>8} {_age(w.lag):>8} {w.consecutive_failures:>5}  {w.last_error}"
            )
    if r.poison_windows:
        lines.append("")
        lines.append(f"{'POISON WINDOW':36} {'KEY':40} {'TRIES':>5}  ERROR")
        for p in r.poison_windows:
            key = f"{p.org_id}/{p.provider}/{p.external_channel_id}"
            lines.append(f"{p.id:36} {key:40} {p.attempts:>5}  {p.error}")
    return "\n".join(lines)
