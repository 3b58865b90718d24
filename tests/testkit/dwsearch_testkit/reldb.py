"""Database checks of the reliability tests: a fingerprint of every table (what a
rejected request must leave as it was), the sweep's consistency invariants (what a
crash, a restart or a kill must never break), and seeding of chat sessions whose
windows are known in advance."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg

from dwsearch_testkit.seed import enable_semantic_search, insert_events

PROVIDER = "whatsapp"


def fingerprint(url: str) -> dict[str, tuple[int, str]]:
    """Row count and an md5 over every row's text, for every table of the test schema
    (dwsearch's and the Go-owned ones)."""
    with psycopg.connect(url) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                """SELECT table_name FROM information_schema.tables
                   WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name"""
            ).fetchall()
        ]
        out = {}
        for table in tables:
            count, digest = conn.execute(
                f"SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM \"{table}\" t"
            ).fetchone()
            out[table] = (count, digest)
    assert "dw_message_embeddings" in out and "dw_index_documents" in out, out.keys()
    return out


def seed_sessions(
    url: str, orgs: list[str], channels: int, sessions: int, messages: int, *, days_ago: float = 2.0
) -> dict[tuple[str, str], list[tuple[str, ...]]]:
    """For each org and channel, `sessions` chat sessions of `messages` messages one
    minute apart, an hour between sessions, all long closed: each session is exactly one
    window (under the 15-message cap and the token limit, substantial). Flags on for
    every org. Returns (org, channel) -> the windows' message ids, in order."""
    enable_semantic_search(url, *orgs)
    start = datetime.now(UTC) - timedelta(days=days_ago)
    windows: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    for org in orgs:
        for c in range(channels):
            channel = f"ch{c}"
            rows = [
                (org, PROVIDER, channel, f"{org} {channel} session {s} message {m} about the parcel refund",
                 start + timedelta(hours=s, minutes=m))
                for s in range(sessions)
                for m in range(messages)
            ]  # fmt: skip
            ids = insert_events(url, rows)
            windows[(org, channel)] = [tuple(ids[s * messages : (s + 1) * messages]) for s in range(sessions)]
    return windows


def embedded_windows(url: str) -> list[tuple[str, ...]]:
    """Source ids of every stored embedding row (all orgs, all models)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT source_message_ids FROM dw_message_embeddings").fetchall()
    return [tuple(ids) for (ids,) in rows]


def check_sweep_consistency(url: str, *, purged: bool = False) -> None:
    """What one transaction per window guarantees, whatever was cut short:
    - every embedding row has its finished-window row (same id, status embedded, same
      events) and every embedded window its embedding row;
    - every finished window's events are in the ledger, pointing at it, once;
    - every watermark sits exactly at the last event of its key's last finished window
      (a window never committed without its watermark advance, nor the reverse); with
      `purged`, a key of an org with a retention cutoff may have no finished window left
      (a Purge deleted them all; its watermark stays)."""
    # Every join is on org_id too, the distribution column on Citus (co-located tables).
    with psycopg.connect(url) as conn:
        orphans = conn.execute(
            """SELECT e.id FROM dw_message_embeddings e
               LEFT JOIN dw_sweep_windows w ON w.org_id = e.org_id AND w.id = e.id AND w.status = 'embedded'
                    AND w.source_message_ids::text[] = e.source_message_ids::text[]
               WHERE w.id IS NULL"""
        ).fetchall()
        assert orphans == [], f"embedding rows without their window: {orphans}"
        missing = conn.execute(
            """SELECT w.id FROM dw_sweep_windows w
               LEFT JOIN dw_message_embeddings e ON e.org_id = w.org_id AND e.id = w.id
               WHERE w.status = 'embedded' AND e.id IS NULL"""
        ).fetchall()
        assert missing == [], f"embedded windows without their embedding row: {missing}"
        ledger = conn.execute(
            """SELECT w.id FROM dw_sweep_windows w
               LEFT JOIN dw_sweep_window_events l ON l.org_id = w.org_id AND l.window_id = w.id
                    AND l.event_id = ANY(w.source_message_ids)
               GROUP BY w.org_id, w.id, w.source_message_ids
               HAVING count(l.event_id) <> cardinality(w.source_message_ids)"""
        ).fetchall()
        assert ledger == [], f"windows whose events are not all in the ledger: {ledger}"
        marks = conn.execute(
            """WITH last AS (
                   SELECT DISTINCT ON (w.org_id, w.provider, w.external_channel_id, w.model)
                          w.org_id, w.provider, w.external_channel_id, w.model, e.id
                   FROM dw_sweep_windows w
                   JOIN dw_sweep_window_events l ON l.org_id = w.org_id AND l.window_id = w.id
                   JOIN dw_chat_events e ON e.org_id = l.org_id AND e.id = l.event_id
                   ORDER BY w.org_id, w.provider, w.external_channel_id, w.model, e.created_at DESC, e.id DESC)
               SELECT m.org_id, m.external_channel_id, m.last_event_id::text, last.id::text
               FROM dw_sweep_watermarks m
               LEFT JOIN last ON last.org_id = m.org_id AND last.provider = m.provider
                    AND last.external_channel_id = m.external_channel_id AND last.model = m.model"""
        ).fetchall()
        retention = {org for (org,) in conn.execute("SELECT org_id FROM dw_sweep_retention").fetchall()}
        wrong = [m for m in marks if m[2] != m[3] and not (purged and m[3] is None and m[0] in retention)]
        assert wrong == [], (
            f"watermarks not at their last finished window (org, channel, mark, last): {wrong}"
        )


def check_exactly_once(url: str, expected: dict[tuple[str, str], list[tuple[str, ...]]]) -> None:
    """Every expected window embedded once, nothing else: no duplicates, no gaps."""
    stored = embedded_windows(url)
    duplicates = [ids for ids, n in Counter(stored).items() if n > 1]
    assert duplicates == [], f"windows embedded twice: {duplicates}"
    want = {ids for windows in expected.values() for ids in windows}
    assert set(stored) == want, f"missing {len(want - set(stored))}, unexpected {len(set(stored) - want)}"
