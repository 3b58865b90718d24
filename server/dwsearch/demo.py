"""`dwsearch demo`: the whole stack on the embedded defaults with a sample multilingual
chat history — load it, switch semantic search on, sweep it into embeddings, then run a
handful of queries and print hybrid results beside what full-text search alone finds."""

from __future__ import annotations

import argparse
import shutil
import textwrap
from datetime import UTC, datetime, timedelta

import grpc
import psycopg

from dwsearch.common.config import ClientConfig, StackConfig
from dwsearch.demo_data import CONVERSATIONS, DEMO_ORG, QUERIES
from dwsearch.flags import MODULE_FLAG, SEMANTIC_SEARCH_FLAG
from dwsearch.stack import LocalStack, with_console
from dwsearch.v1 import search_pb2 as pb
from dwsearch.v1 import search_pb2_grpc

# Conversations start a week ago, one every six hours, a minute between messages: every
# window is closed, so the sweep embeds them all.
HISTORY_START = timedelta(days=7)
CONVERSATION_SPACING = timedelta(hours=6)
MESSAGE_SPACING = timedelta(minutes=1)
SHOWN_HITS = 3


SampleRow = tuple[str, str, str, str, str, str, datetime]
"""dw_chat_events (org_id, provider, external_channel_id, event_type, decision, message_text, created_at)."""


def sample_rows(now: datetime) -> list[SampleRow]:
    rows: list[SampleRow] = []
    start = now - HISTORY_START
    for i, conv in enumerate(CONVERSATIONS):
        for j, text in enumerate(conv.messages):
            at = start + i * CONVERSATION_SPACING + j * MESSAGE_SPACING
            rows.append((DEMO_ORG, conv.provider, conv.channel, "message", "received", text, at))
    return rows


def load_sample_chat(url: str) -> int:
    """Insert the sample chat once (a rerun finds it there) and switch the flags on."""
    expected = sum(len(c.messages) for c in CONVERSATIONS)
    with psycopg.connect(url, autocommit=True) as conn:
        counted = conn.execute(
            "SELECT count(*) FROM dw_chat_events WHERE org_id = %s", (DEMO_ORG,)
        ).fetchone()
        have = counted[0] if counted else 0
        if have != expected:
            with conn.transaction():
                conn.execute("DELETE FROM dw_chat_events WHERE org_id = %s", (DEMO_ORG,))
                with conn.cursor().copy(
                    "COPY dw_chat_events (org_id, provider, external_channel_id, event_type, decision,"
                    " message_text, created_at) FROM STDIN"
                ) as copy:
                    for row in sample_rows(datetime.now(UTC)):
                        copy.write_row(row)
        conn.execute(
            "UPDATE admin_feature_flags SET enabled = true WHERE flag_key = %s", (SEMANTIC_SEARCH_FLAG,)
        )
        for flag in (MODULE_FLAG, SEMANTIC_SEARCH_FLAG):
            conn.execute(
                """INSERT INTO org_feature_flags (org_id, flag_key, enabled) VALUES (%s, %s, true)
                   ON CONFLICT (org_id, flag_key) DO UPDATE SET enabled = true""",
                (DEMO_ORG, flag),
            )
    print(
        f"sample chat: {expected} messages in {len(CONVERSATIONS)} conversations "
        f"(English, Malay, Chinese, rojak) for org {DEMO_ORG!r}"
    )
    return expected


def sweep(stack: LocalStack) -> int:
    from dwsearch.sweep.commands import run_sweep_command

    config = ClientConfig(
        server_addr=stack.server_address, auth_token=stack.config.auth_token, log_format="text"
    )
    args = argparse.Namespace(org_id=DEMO_ORG, max_windows=0, max_duration=0.0, progress=None)
    return run_sweep_command(config, args)


def _line(hit: pb.SearchHit, width: int) -> str:
    text = " / ".join(part for part in hit.text.splitlines() if part.strip())
    sources = ", ".join(
        f"{name} #{getattr(hit, name).rank}" for name in ("fts", "dense", "sparse") if getattr(hit, name).rank
    )
    return textwrap.shorten(f"[{sources}] {text}", width=width, placeholder=" …")


def show(stub: search_pb2_grpc.SearchServiceStub, metadata: tuple[tuple[str, str], ...]) -> None:
    width = max(60, min(shutil.get_terminal_size((100, 20)).columns, 140) - 14)
    for query in QUERIES:
        print(f"\n» {query.text!r} — {query.note}")
        for label, mode in (("hybrid", pb.SEARCH_MODE_HYBRID), ("FTS only", pb.SEARCH_MODE_FTS)):
            response = stub.Search(
                pb.SearchRequest(org_id=DEMO_ORG, query=query.text, limit=SHOWN_HITS, mode=mode),
                timeout=30,
                metadata=metadata,
            )
            if response.degraded:
                label += (
                    " (degraded: "
                    + ", ".join(pb.DegradationReason.Name(d.reason) for d in response.degradations)
                    + ")"
                )
            if not response.hits:
                print(f"  {label:<10} — nothing found")
            for i, hit in enumerate(response.hits):
                print(f"  {label if i == 0 else '':<10} {i + 1}. {_line(hit, width)}")


def run_demo(config: StackConfig, *, keep_running: bool = False) -> int:
    if keep_running:  # a stack left running for a look: with the web console, as dev has it
        config = with_console(config)
    stack = LocalStack(config)
    stack.start()
    try:
        stack.print_status()
        load_sample_chat(stack.url)
        if sweep(stack) != 0:
            print("sweep failed; see the server log", flush=True)
            stack.stop()  # its processes (and a --citus-workers cluster) end with the demo
            return 1
        metadata = (("authorization", f"Bearer {config.auth_token}"),) if config.auth_token else ()
        with grpc.insecure_channel(stack.server_address) as channel:
            show(search_pb2_grpc.SearchServiceStub(channel), metadata)
    except BaseException:
        stack.stop()
        raise
    if keep_running:
        print(f"\nstack running — SearchService / SweepService / IndexService at {stack.server_address}")
        stack.print_status()
        print("Ctrl-C stops it")
        return stack.wait()
    stack.stop()
    return 0
