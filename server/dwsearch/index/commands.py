"""`dwsearch gaps`: a client of IndexService's knowledge-gap RPCs (dwsearch.index.gaps).

`dwsearch gaps --org-id ORG [--since 7d] [--limit N] [--json]` lists the org's knowledge
gaps grouped by similarity, most frequent first: count, first and last seen, best
knowledge score, the representative question and its near duplicates. `--forget ID ...`
or `--forget-all` deletes gaps instead. Exit 0 on success, 1 when the call failed (the
server's status and message printed: INVALID_ARGUMENT for a bad org id or limit), 2 on
arguments it would not send (a --since it cannot read, --forget with --forget-all).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import grpc
from google.protobuf.json_format import MessageToJson
from google.protobuf.timestamp_pb2 import Timestamp

from dwsearch.clients.channel import auth_metadata, dial
from dwsearch.common.config import ClientConfig
from dwsearch.common.tls import client_tls
from dwsearch.v1 import index_pb2 as pb
from dwsearch.v1 import index_pb2_grpc as pb_grpc

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

R = TypeVar("R")


def run_gaps_command(
    cfg: ClientConfig, args: argparse.Namespace, *, parse_time: Callable[..., datetime]
) -> int:
    """`parse_time(text, now=...)`: --since as an ISO 8601 time or an age such as 7d (the
    purge command's parser, dwsearch.sweep.commands.parse_cutoff, given by the CLI)."""
    if args.forget or args.forget_all:
        if args.forget and args.forget_all:
            print("gaps: --forget and --forget-all: give one of them", file=sys.stderr)
            return EXIT_USAGE
        forget = pb.ForgetKnowledgeGapsRequest(org_id=args.org_id, ids=args.forget or [], all=args.forget_all)
        done = asyncio.run(_call(cfg, "gaps", lambda stub, **kw: stub.ForgetKnowledgeGaps(forget, **kw)))
        if done is None:
            return EXIT_FAILED
        print(f"deleted {done.deleted} knowledge gap(s) of org {args.org_id}")
        return EXIT_OK
    request = pb.ListKnowledgeGapsRequest(org_id=args.org_id, limit=args.limit)
    if args.since:
        try:
            since = parse_time(args.since, now=datetime.now(UTC))
        except ValueError as exc:
            print(f"gaps: --since: {exc}", file=sys.stderr)
            return EXIT_USAGE
        stamp = Timestamp()
        stamp.FromDatetime(since)
        request.since.CopyFrom(stamp)
    response = asyncio.run(_call(cfg, "gaps", lambda stub, **kw: stub.ListKnowledgeGaps(request, **kw)))
    if response is None:
        return EXIT_FAILED
    print(MessageToJson(response) if args.json else gaps_table(response))
    return EXIT_OK


def gaps_table(response: pb.ListKnowledgeGapsResponse) -> str:
    """One line per group (count, first and last seen, best score, question), its near
    duplicates indented below, and a summary line."""
    lines = []
    if response.groups:
        lines.append(f"{'COUNT':>5}  {'FIRST SEEN':<16}  {'LAST SEEN':<16}  {'BEST':>5}  QUESTION")
    for group in response.groups:
        best = f"{group.best_score:.2f}" if group.HasField("best_score") else "-"
        lines.append(
            f"{group.count:>5}  {_time(group.first_seen)}  {_time(group.last_seen)}  {best:>5}  {group.query}"
        )
        lines.extend(f"{'':>50}~ {example}" for example in group.examples)
    more = " (only the most recent were grouped)" if response.truncated else ""
    lines.append(
        f"{len(response.groups)} group(s) of {response.gaps} gap(s){more}; "
        f"questions grouped at cosine >= {response.similarity:.2f}"
    )
    return "\n".join(lines)


def _time(stamp: Timestamp) -> str:
    return stamp.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M")


async def _call(cfg: ClientConfig, name: str, call: Callable[..., Awaitable[R]]) -> R | None:
    """One unary IndexService call; None (the error printed) when it fails."""
    channel = dial(cfg.server_addr, client_tls(cfg.tls_ca, cfg.tls_client_cert, cfg.tls_client_key))
    try:
        async with channel:
            stub = pb_grpc.IndexServiceStub(channel)
            return await call(stub, timeout=cfg.timeout_seconds, metadata=auth_metadata(cfg.auth_token))
    except grpc.aio.AioRpcError as exc:
        print(f"{name} failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return None
