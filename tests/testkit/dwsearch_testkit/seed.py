"""Helpers that write Go-owned rows (events, flags) the way the digitalworker module does."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import psycopg

from dwsearch.flags import MODULE_FLAG, SEMANTIC_SEARCH_FLAG

# A fixed time for test data.
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def enable_semantic_search(url: str, *orgs: str, admin: bool = True) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE admin_feature_flags SET enabled = %s WHERE flag_key = %s", (admin, SEMANTIC_SEARCH_FLAG)
        )
        for org in orgs:
            for flag in (MODULE_FLAG, SEMANTIC_SEARCH_FLAG):
                conn.execute(
                    """INSERT INTO org_feature_flags (org_id, flag_key, enabled) VALUES (%s, %s, true)
                       ON CONFLICT (org_id, flag_key) DO UPDATE SET enabled = true""",
                    (org, flag),
                )


def set_org_flag(url: str, org: str, flag: str, enabled: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO org_feature_flags (org_id, flag_key, enabled) VALUES (%s, %s, %s)
               ON CONFLICT (org_id, flag_key) DO UPDATE SET enabled = excluded.enabled""",
            (org, flag, enabled),
        )


def insert_events(
    url: str,
    rows: Iterable[tuple[str, str, str, str, datetime]],
    *,
    event_type: str = "message",
    decision: str = "received",
) -> list[str]:
    """Insert (org, provider, channel, text, created_at) messages; return their ids."""
    ids = []
    with psycopg.connect(url, autocommit=True) as conn:
        for org, provider, channel, text, created_at in rows:
            (event_id,) = conn.execute(
                """INSERT INTO dw_chat_events
                   (org_id, provider, external_channel_id, event_type, decision, message_text, created_at)
                   VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id::text""",
                (org, provider, channel, event_type, decision, text, created_at),
            ).fetchone()
            ids.append(event_id)
    return ids


def insert_window(
    url: str,
    *,
    org: str,
    model: str,
    provider: str,
    channel: str,
    message_ids: list[str],
    content: str,
    start: datetime,
    end: datetime,
    dense,
    sparse: dict[int, float] | None = None,
    sparse_dimension: int = 1 << 24,
    lexical: bool = True,
) -> str:
    """Write an embedded window directly, as a sweep would: the embedding row, its lexical
    weights, their projection and their counts (`lexical`; False: as a window embedded
    before the lexical leg existed), and the ledger rows that map each message to it."""
    from pgvector import HalfVector, SparseVector
    from pgvector.psycopg import register_vector

    from dwsearch.sweep.store.lexical import COUNT, LEXICAL_TERMS, PROJECT, window_lexical

    weights, terms = window_lexical(content) if lexical else (None, [])

    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        (window_id,) = conn.execute(
            """INSERT INTO dw_message_embeddings
               (org_id, model, provider, external_channel_id, window_start, window_end, embedding, sparse,
                lexical, lexical_terms, content, source_message_ids)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id::text""",
            (
                org,
                model,
                provider,
                channel,
                start,
                end,
                HalfVector(dense),
                SparseVector(sparse, sparse_dimension) if sparse else None,
                weights,
                LEXICAL_TERMS if lexical else None,
                content,
                message_ids,
            ),
        ).fetchone()
        if terms:
            conn.execute(COUNT, {"org": org, "model": model, "terms": terms, "deltas": [1] * len(terms)})
            conn.execute(PROJECT, {"org": org, "windows": [window_id]})
        conn.execute(
            """INSERT INTO dw_sweep_windows (id, org_id, provider, external_channel_id, model, status,
                                             window_start, window_end, source_message_ids)
               VALUES (%s, %s, %s, %s, %s, 'embedded', %s, %s, %s::uuid[])""",
            (window_id, org, provider, channel, model, start, end, message_ids),
        )
        for event_id in message_ids:
            conn.execute(
                "INSERT INTO dw_sweep_window_events (org_id, model, event_id, window_id) VALUES (%s, %s, %s, %s)",
                (org, model, event_id, window_id),
            )
    return window_id
