"""`dwsearch sweep` and `dwsearch purge`: clients of SweepService, what the Kubernetes
CronJob and the retention job run.

`dwsearch sweep` calls Sweep with the deadline DWSEARCH_TIMEOUT_SECONDS, shows a progress
bar on a terminal (stderr is a TTY, or --progress), prints a summary and exits:
- 0 when the sweep ran, stalled keys included — their watermarks wait for the next run,
  which is how a transient failure is retried; each is printed as a warning;
- 1 when the call failed (any RPC error: embedder serving another model, database or
  server unreachable, deadline passed) or ended without its summary;
- 3 when keys stalled and nothing else moved: no window finished and no key caught up
  (e.g. the embedder rejects every call), so the CronJob shows up as failing.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from datetime import datetime, timedelta, timezone

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from tqdm import tqdm

from dwsearch.clients.channel import auth_metadata, dial
from dwsearch.common.config import ClientConfig
from dwsearch.common.tls import client_tls
from dwsearch.v1 import sweep_pb2 as pb
from dwsearch.v1 import sweep_pb2_grpc as pb_grpc

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ALL_STALLED = 3

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def run_sweep_command(cfg: ClientConfig, args: argparse.Namespace) -> int:
    show = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    request = pb.SweepRequest(org_id=args.org_id or "", max_windows=max(int(args.max_windows or 0), 0))
    if args.max_duration and args.max_duration > 0:
        request.max_duration.CopyFrom(_duration(args.max_duration))
    return asyncio.run(_sweep(cfg, request, show))


def run_purge_command(cfg: ClientConfig, args: argparse.Namespace) -> int:
    try:
        cutoff = parse_cutoff(args.cutoff, now=datetime.now(timezone.utc))
    except ValueError as exc:
        print(f"purge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_purge(cfg, args.org_id, cutoff))


def parse_cutoff(text: str, *, now: datetime) -> datetime:
    """An ISO 8601 time (UTC when it names no zone), or an age such as 30d, 12h, 90m."""
    match = _DURATION.match(text)
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"cutoff {text!r} is neither an ISO 8601 time nor an age like 30d") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _channel(cfg: ClientConfig) -> grpc.aio.Channel:
    return dial(cfg.server_addr, client_tls(cfg.tls_ca, cfg.tls_client_cert, cfg.tls_client_key))


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromTimedelta(timedelta(seconds=seconds))
    return d


async def _sweep(cfg: ClientConfig, request: pb.SweepRequest, show_progress: bool) -> int:
    summary = None
    bar = tqdm(total=0, unit="msg", desc="sweep", file=sys.stderr, disable=not show_progress, dynamic_ncols=True)
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
            print(f"  {key.org_id}/{key.provider}/{key.external_channel_id}: {key.error}", file=sys.stderr)
    finished = summary.windows_embedded + summary.windows_skipped + summary.windows_poisoned
    if summary.keys_stalled and not finished and not summary.keys_done:
        print("sweep failed: every key it tried stalled", file=sys.stderr)
        return EXIT_ALL_STALLED
    return EXIT_OK


def _update(bar: tqdm, progress: pb.SweepResponse) -> None:
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
    if p.budget_exhausted:
        text += "; budget exhausted, the rest waits for the next sweep"
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
