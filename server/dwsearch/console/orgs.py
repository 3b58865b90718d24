"""The orgs that have chat, for the console's org picker and its Overview: the limits of
the console's requests, and an org's figures as the page shows them. The reads are the
sweep's (dwsearch.sweep.overview): the picker's orgs a loose index scan, a page of figures
one statement that stops once the page is full."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dwsearch.sweep.overview import OrgFigures

MAX_ORGS = 500
"""The most orgs the picker lists; any other org can still be typed."""
PAGE = 20
"""Orgs on a page of figures, unless asked otherwise."""
MAX_PAGE = 100
MAX_QUERY = 256
"""The longest org id filter (as long as an org id)."""


def as_json(figures: OrgFigures, now: datetime) -> dict[str, Any]:
    """An org's figures as the Overview draws them: the share of its events found by
    meaning and its lag (None when the sweep does not embed it), not raw counts alone."""
    searchable = figures.searchable_events / figures.events if figures.events else None
    lag = (now - figures.oldest_pending).total_seconds() if figures.oldest_pending else 0.0
    return {
        "org_id": figures.org_id,
        "semantic_search": figures.semantic_search,
        "windows_embedded": figures.windows_embedded,
        "events": figures.events,
        "pending_events": figures.pending_events,
        "searchable_share": searchable if figures.semantic_search else 0.0 if figures.events else None,
        "lag_s": max(0.0, lag) if figures.semantic_search else None,
        "stalled_keys": figures.stalled_keys,
        "poison_windows": figures.poison_windows,
        "knowledge_gaps": figures.knowledge_gaps,
    }


def now() -> datetime:
    return datetime.now(UTC)
