"""Agent-context sections: the filters of docs/design.md, "Agent context", as ASTs, the
candidate pool, the split of reranked hits — no database."""

from decimal import Decimal

import pytest

from dwsearch.index.context import (
    SECTION_TOP_K,
    Section,
    candidate_filter,
    dedupe,
    section_filter,
    split_by_section,
)
from dwsearch.index.documents import Hit, StoredDocument
from dwsearch.index.filter import compile_filter, evaluate, parse_filter


def test_section_filters_match_the_documented_text():
    app = "app-1"
    documented = {
        Section.SIMILAR_TICKETS: "appId = 'app-1' AND type = 'conversation' AND resolution != 'escalated'",
        Section.KNOWLEDGE: "appId = 'app-1' AND type = 'knowledge'",
        Section.GOOD_RESPONSES: "appId = 'app-1' AND type = 'response' AND trustScore > 0.85",
    }
    for section, text in documented.items():
        assert section_filter(app, section) == parse_filter(text)
    assert SECTION_TOP_K == {Section.SIMILAR_TICKETS: 3, Section.KNOWLEDGE: 5, Section.GOOD_RESPONSES: 3}


@pytest.mark.parametrize("app_id", ["it's", "x' OR 1=1 --", 'say "hi"', "应用", "a\\b"])
def test_app_ids_with_quotes_are_values_not_syntax(app_id):
    node = section_filter(app_id, Section.KNOWLEDGE)
    assert evaluate(node, {"appId": app_id, "type": "knowledge"})
    assert not evaluate(node, {"appId": "other", "type": "knowledge"})
    _, params = compile_filter(node)
    assert app_id in params


def test_candidates_are_the_union_of_the_sections():
    docs = [
        {"appId": "a", "type": "conversation"},
        {"appId": "a", "type": "conversation", "resolution": "escalated"},
        {"appId": "a", "type": "knowledge"},
        {"appId": "a", "type": "response", "trustScore": 0.9},
        {"appId": "a", "type": "response", "trustScore": 0.5},
        {"appId": "b", "type": "knowledge"},
        {"appId": "a", "type": "other"},
    ]
    union = [any(evaluate(section_filter("a", s), d) for s in Section) for d in docs]
    assert (
        [evaluate(candidate_filter("a"), d) for d in docs]
        == union
        == [True, False, True, True, False, False, False]
    )


def hit(doc_id: str, **metadata) -> Hit:
    return Hit(StoredDocument(doc_id, data=doc_id, metadata=metadata), 1.0)


def test_split_keeps_order_and_caps_each_section():
    hits = [hit(f"k{i}", type="knowledge") for i in range(7)] + [
        hit("c1", type="conversation"),
        hit("c2", type="conversation", resolution="escalated"),
        hit("r1", type="response", trustScore=0.9),
        hit("r2", type="response", trustScore=0.85),
    ]
    sections = split_by_section(hits)
    assert [h.document.id for h in sections[Section.KNOWLEDGE]] == ["k0", "k1", "k2", "k3", "k4"]
    assert [h.document.id for h in sections[Section.SIMILAR_TICKETS]] == ["c1"]
    assert [h.document.id for h in sections[Section.GOOD_RESPONSES]] == ["r1"]


def test_dedupe_keeps_first_occurrence():
    assert [h.document.id for h in dedupe([hit("a"), hit("b"), hit("a"), hit("c")])] == ["a", "b", "c"]


def test_min_trust_score_is_exact():
    node = section_filter("a", Section.GOOD_RESPONSES)
    assert not evaluate(node, {"appId": "a", "type": "response", "trustScore": 0.85})
    assert evaluate(node, {"appId": "a", "type": "response", "trustScore": Decimal("0.8500001")})
