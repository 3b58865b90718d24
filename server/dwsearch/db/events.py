"""The one rule for which rows of the Go-owned dw_chat_events are chat that dwsearch
reads: the sweep embeds only these, and search (full text, context, vocabulary) finds
only these. Denied and verification traffic is never embedded nor searched
(docs/design.md, "Eligible events": `event_type='message' AND decision IN ('received',
'processed')`)."""

from __future__ import annotations

from psycopg import sql

ELIGIBLE_EVENT_TYPE = "message"
ELIGIBLE_DECISIONS = ("received", "processed")


def eligible(alias: str = "") -> sql.Composed:
    """The eligibility predicate over dw_chat_events columns, qualified by the table
    `alias` when given. Constants are rendered as literals: the predicate needs no
    query parameters, so it composes into any statement."""
    prefix = sql.SQL("{}.").format(sql.Identifier(alias)) if alias else sql.SQL("")
    return sql.SQL("{p}event_type = {event_type} AND {p}decision IN ({decisions})").format(
        p=prefix,
        event_type=sql.Literal(ELIGIBLE_EVENT_TYPE),
        decisions=sql.SQL(", ").join(sql.Literal(d) for d in ELIGIBLE_DECISIONS),
    )


# Unqualified, for statements over dw_chat_events alone.
ELIGIBLE_EVENTS = eligible()
