"""One eligibility rule (dwsearch.db.events) for the sweep and for search: over every
(event_type, decision) pair, the events the sweep embeds are exactly the events full-text
search finds, and exactly those the rule names."""

from itertools import product

from sweep_harness import ORG, Harness

from dwsearch.db.events import ELIGIBLE_DECISIONS, ELIGIBLE_EVENT_TYPE
from dwsearch.search.query import Mode, SearchQuery
from dwsearch.search.searcher import Searcher
from dwsearch.search.settings import SearchSettings
from dwsearch_testkit.fakes import FAKE_MODEL

EVENT_TYPES = (ELIGIBLE_EVENT_TYPE, "verification", "system")
DECISIONS = (*ELIGIBLE_DECISIONS, "denied", "pending")


async def test_the_sweep_and_full_text_search_share_the_eligibility_rule(harness: Harness):
    eligible: set[str] = set()
    every: set[str] = set()
    for n, (event_type, decision) in enumerate(product(EVENT_TYPES, DECISIONS)):
        # Each event alone in its channel: one window each, embedded when eligible.
        (event_id,) = harness.insert(
            f"c{n}",
            [(0, f"parcel tracking question {event_type} {decision} about the delivery")],
            event_type=event_type,
            decision=decision,
        )
        every.add(event_id)
        if event_type == ELIGIBLE_EVENT_TYPE and decision in ELIGIBLE_DECISIONS:
            eligible.add(event_id)
    assert len(eligible) == len(ELIGIBLE_DECISIONS) and len(every) == len(EVENT_TYPES) * len(DECISIONS)

    await harness.sweep()
    swept = {i for ids in harness.embedded() for i in ids}
    searcher = Searcher(
        harness.pool,
        harness.embedder,
        None,
        SearchSettings(models=(FAKE_MODEL,), embed_timeout=10, rerank_timeout=10),
    )
    result = await searcher.search(SearchQuery(ORG, "parcel", limit=50, mode=Mode.FTS))
    found = {h.id for h in result.hits}
    assert swept == found == eligible
