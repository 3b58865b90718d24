"""Window-level reciprocal rank fusion, without a database."""

from datetime import UTC, datetime, timedelta

from dwsearch.retrieval.fusion import RRF_K
from dwsearch.search.fusion import Leg, fuse
from dwsearch.search.rows import MessageRow, WindowRow

T = datetime(2026, 11, 1, tzinfo=UTC)


def msg(i: str, minute: int = 0) -> MessageRow:
    return MessageRow(i, "wa", "c1", T + timedelta(minutes=minute), f"text {i}", 0.1)


def win(i: str, ids: tuple[str, ...], minute: int = 0, score: float = 0.5) -> WindowRow:
    at = T + timedelta(minutes=minute)
    return WindowRow(i, "wa", "c1", at, at, f"window {i}", ids, score)


def fuse_rows(fts=(), dense=(), sparse=(), fts_windows=(), **kwargs):
    """The three legs of one model: full text (with the windows holding its matches), dense, sparse."""
    return fuse([Leg("fts", fts, tuple(fts_windows)), Leg("dense", dense), Leg("sparse", sparse)], **kwargs)


def test_rrf_constant_is_60():
    assert RRF_K == 60


def test_fts_hit_inside_embedded_window_joins_it():
    w = win("w1", ("m1", "m2"))
    out = fuse_rows([msg("m2")], dense=[w], fts_windows=[w], method="rrf", weights={"fts": 1.0})
    assert [c.id for c in out] == ["w1"]
    (c,) = out
    assert c.kind == "window" and c.matched_message_ids == ["m2"]
    assert c.sources["fts"].rank == 1 and c.sources["dense"].rank == 1
    assert c.fused == 2 / (RRF_K + 1)


def test_message_not_embedded_stands_alone():
    out = fuse_rows([msg("m9")], dense=[win("w1", ("m1",))])
    assert {(c.kind, c.id) for c in out} == {("message", "m9"), ("window", "w1")}


def test_window_takes_its_best_fts_rank_and_lists_every_match():
    w = win("w1", ("m1", "m2", "m3"))
    out = fuse_rows([msg("m3"), msg("x"), msg("m1")], fts_windows=[w])
    c = next(c for c in out if c.id == "w1")
    assert c.sources["fts"].rank == 1
    assert c.matched_message_ids == ["m3", "m1"]


def test_in_both_sources_beats_in_one():
    both = win("both", ("a",))
    out = fuse_rows([msg("a")], dense=[win("dense-only", ("z",)), both], fts_windows=[both])
    assert out[0].id == "both"


def test_dense_and_sparse_dedup_to_one_candidate():
    w = win("w1", ("a",))
    out = fuse_rows([], dense=[w], sparse=[w])
    assert len(out) == 1 and out[0].sources["sparse"].rank == 1


def test_ties_break_by_recency_then_id():
    out = fuse_rows([], dense=[win("old", ("1",), minute=0)], sparse=[win("new", ("2",), minute=5)])
    assert [c.id for c in out] == ["new", "old"]
