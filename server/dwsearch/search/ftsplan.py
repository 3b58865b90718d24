"""Which full-text plan a query gets (fulltext.full_text_statement): through the Go module's
GIN index on search_tsv, or org-first over the org's own rows.

The GIN index holds every org's postings. A query through it costs about the length of
its rarest lexeme's posting list (Postgres skips through the longer ones), summed over all
orgs; org-first costs the org's event count, whatever the words. So:
- an org above `max_events` always uses the GIN index (org-first would read too much);
- otherwise GIN when the rarest lexeme's postings, estimated from the column's statistics
  (pg_stats.most_common_elems, as the planner's own estimates), are no more than the org's
  events — a rare word, an order number, a name — and org-first when every word is
  common, which is when the GIN plan is slow (measured: `python -m bench.search`);
- without statistics (a table never analyzed), by size alone.
Both plans return the same rows; only the cost differs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from psycopg import AsyncConnection

from dwsearch.common.ttlcache import TtlCache
from dwsearch.search.store import fulltext

# Orgs with more events than this always use the GIN index. Measured crossover with
# common words at 575k events in the table: org-first 3.4 ms at 10k events, 9.1 at 25k,
# 19 at 50k, against 15-16 ms for the GIN plan (`python -m bench.search`).
FTS_ORG_FIRST_MAX_EVENTS = 30_000
# How long an org's event count and the column's statistics are reused; both change
# slowly next to this.
STATS_TTL_S = 600.0
# The default text-search parser splits on what is not a letter or digit, "_" included.
_WORD = re.compile(r"[^\W_]+")
UNLISTED_MAX_FREQUENCY = 0.005


@dataclass(frozen=True)
class LexemeStats:
    """search_tsv's most common lexemes with their frequencies (share of rows), and the
    table's row count."""

    frequencies: Mapping[str, float]
    rows: float

    @property
    def min_frequency(self) -> float:
        return min(self.frequencies.values())

    def rarest_postings(self, lexemes: Sequence[str]) -> float:
        """Estimated rows holding the query's rarest lexeme. A lexeme missing from the list
        is rarer than every listed one: half the smallest listed frequency, at most 0.5%,
        as Postgres assumes (tsquery_opr_selec in ts_selfuncs.c)."""
        unlisted = min(UNLISTED_MAX_FREQUENCY, self.min_frequency / 2)
        return self.rows * min((self.frequencies.get(lexeme, unlisted) for lexeme in lexemes), default=0.0)


def query_lexemes(text: str) -> list[str]:
    """The words of a query, lower-cased: close to what plainto_tsquery('simple', …)
    makes of it (emails and URLs split into parts, which only makes them look commoner)."""
    return _WORD.findall(text.lower())


def choose_org_first(
    org_events: int, max_events: int, stats: LexemeStats | None, lexemes: Sequence[str]
) -> bool:
    if max_events <= 0 or org_events > max_events:
        return False
    if stats is None:
        return True
    return stats.rarest_postings(lexemes) > org_events


class FtsPlanner:
    """Chooses per query, from cached counts and statistics (one query each per org and
    per STATS_TTL_S)."""

    def __init__(
        self, max_events: int = FTS_ORG_FIRST_MAX_EVENTS, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_events = max_events
        self._org_events: TtlCache[str, int] = TtlCache(STATS_TTL_S, clock=clock, name="fts_org_events")
        self._stats: TtlCache[str, LexemeStats | bool] = TtlCache(STATS_TTL_S, max_entries=1, clock=clock)

    async def org_first(self, conn: AsyncConnection, org_id: str, text: str) -> bool:
        if self.max_events <= 0:
            return False
        org_events = self._org_events.get(org_id)
        if org_events is None:
            org_events = await fulltext.org_events_at_most(conn, org_id, self.max_events)
            self._org_events.put(org_id, org_events)
        if org_events > self.max_events:
            return False
        stats = self._stats.get("")
        if stats is None:
            found = await fulltext.lexeme_stats(conn)
            stats = LexemeStats(*found) if found else False  # False: none yet, asked again after the TTL
            self._stats.put("", stats)
        known = stats if isinstance(stats, LexemeStats) else None
        return choose_org_first(org_events, self.max_events, known, query_lexemes(text))
