"""The index's pure parts: metadata checks and merge patch, vector checks, cursors and
prefix ranges, scores — no database."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwsearch.common.errors import FailedPrecondition, InvalidArgument
from dwsearch.index.documents import (
    HALFVEC_MAX,
    MAX_PLACE,
    QueryMode,
    decode_cursor,
    decode_place_cursor,
    dense_vector,
    encode_cursor,
    encode_place_cursor,
    prefix_upper_bound,
    resolve_mode,
    sparse_vector,
)
from dwsearch.index.metadata import MAX_METADATA_BYTES, check_metadata, merge_patch
from dwsearch.index.space import Metric, SparseEncoder, VectorSpace

# --- Metadata --------------------------------------------------------------------------


def test_integral_numbers_become_ints():
    assert check_metadata({"touchCount": 3.0, "trustScore": 0.9, "n": [1.0, {"m": -2.0}]}, "m") == {
        "touchCount": 3,
        "trustScore": 0.9,
        "n": [1, {"m": -2}],
    }
    assert isinstance(check_metadata({"big": 1e300}, "m")["big"], float)


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ({"x": math.nan}, "m.x"),
        ({"x": [1.0, math.inf]}, "m.x[1]"),
        ({"x": "a\x00b"}, "NUL"),
        ({"a\x00": 1}, "NUL"),
        ({"x": object()}, "not a JSON value"),
        ({"x": "y" * MAX_METADATA_BYTES}, "limit"),
    ],
)
def test_bad_metadata_is_invalid_and_named(bad, fragment):
    with pytest.raises(InvalidArgument, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        check_metadata(bad, "m")


@pytest.mark.parametrize(
    "target, patch, result",
    [  # RFC 7396, appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch(target, patch, result):
    assert merge_patch(target, patch) == result


def test_merge_patch_leaves_its_inputs_alone():
    target = {"a": {"b": 1}}
    merge_patch(target, {"a": {"b": None}})
    assert target == {"a": {"b": 1}}


# --- Vectors ---------------------------------------------------------------------------


def test_dense_vector_checks():
    assert dense_vector([0.5, -1.0], 2, "v").dtype == np.float32
    for bad, fragment in [
        ([1.0], "1 dimensions"),
        ([math.nan, 0.0], "finite"),
        ([math.inf, 0.0], "finite"),
        ([HALFVEC_MAX * 2, 0.0], "half-precision"),
    ]:
        with pytest.raises(InvalidArgument, match=fragment):
            dense_vector(bad, 2, "v")
    # A space that keeps its vectors in float32 (the REST API's) takes float32's range.
    assert dense_vector([HALFVEC_MAX * 2, 1e30], 2, "v", float32=True)[1] == np.float32(1e30)
    with pytest.raises(InvalidArgument, match="float32"):
        dense_vector([1e39, 0.0], 2, "v", float32=True)


def test_sparse_vector_checks():
    assert sparse_vector({3: 0.5}, 10, "s") == {3: 0.5}
    for bad, fragment in [
        ({10: 1.0}, "outside"),
        ({-1: 1.0}, "outside"),
        ({1: math.nan}, "finite"),
        ({1: 1e39}, "finite"),
    ]:
        with pytest.raises(InvalidArgument, match=fragment):
            sparse_vector(bad, 10, "s")
    with pytest.raises(FailedPrecondition):
        sparse_vector({1: 1.0}, 0, "s")


def test_mode_resolution():
    assert resolve_mode(None, dense=True, sparse=True) is QueryMode.HYBRID
    assert resolve_mode(None, dense=True, sparse=False) is QueryMode.DENSE
    assert resolve_mode(None, dense=False, sparse=True) is QueryMode.SPARSE
    assert resolve_mode(QueryMode.DENSE, dense=True, sparse=True) is QueryMode.DENSE
    for mode, dense, sparse in [
        (QueryMode.HYBRID, True, False),
        (QueryMode.SPARSE, True, False),
        (QueryMode.DENSE, False, True),
    ]:
        with pytest.raises(InvalidArgument, match=mode.value):
            resolve_mode(mode, dense=dense, sparse=sparse)


# --- Cursors and prefixes --------------------------------------------------------------


@given(st.text(min_size=1).filter(lambda s: "\x00" not in s))
def test_cursor_round_trip(last_id):
    assert decode_cursor(encode_cursor(last_id)) == last_id


@pytest.mark.parametrize("cursor", ["!!", "é", encode_cursor("a")[:-1] + "*"])
def test_foreign_cursor_is_invalid(cursor):
    with pytest.raises(InvalidArgument, match="cursor"):
        decode_cursor(cursor)


@given(st.integers(min_value=0, max_value=MAX_PLACE))
def test_a_place_cursor_is_the_next_place_in_decimal(place):
    assert encode_place_cursor(place) == str(place)
    assert decode_place_cursor(encode_place_cursor(place)) == place


def test_the_cursors_rest_indexes_gave_before_still_mark_their_place():
    """They held the last place returned, encode_cursor'd: the page goes on from the next."""
    assert encode_place_cursor(5) == "5"  # Upstash's, after the first five records
    assert decode_place_cursor(encode_cursor("154")) == 155
    assert decode_place_cursor(encode_cursor("0")) == 1
    assert not any(encode_cursor(str(n))[0].isdigit() for n in range(1000))


@pytest.mark.parametrize(
    "cursor",
    [
        "-1",
        "1.5",
        "\u00b2",
        "\u0663",
        str(MAX_PLACE + 1),
        encode_cursor("a-1"),
        encode_cursor(str(MAX_PLACE)),
        "!!",
    ],
)
def test_a_place_cursor_not_given_is_invalid(cursor):
    with pytest.raises(InvalidArgument, match="cursor"):
        decode_place_cursor(cursor)


def test_prefix_bound_edges():
    assert prefix_upper_bound("doc-") == "doc."
    assert prefix_upper_bound("a\U0010ffff") == "b"
    assert prefix_upper_bound("\U0010ffff") is None
    assert prefix_upper_bound("x\ud7ff") == "x\ue000"


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


@given(st.text(min_size=1, alphabet=st.characters(blacklist_categories=["Cs"])), st.text(max_size=3))
def test_prefix_bound_is_exactly_starts_with(prefix, rest):
    bound = prefix_upper_bound(prefix)
    for candidate in (prefix + rest, rest, rest + prefix):
        in_range = _utf8(prefix) <= _utf8(candidate) and (bound is None or _utf8(candidate) < _utf8(bound))
        assert in_range == candidate.startswith(prefix)


# --- Scores ----------------------------------------------------------------------------


def _fixed(metric: Metric, dimension: int = 384) -> VectorSpace:
    return VectorSpace(f"upstash:{metric.value}", dense_from_embedder=False, sparse=SparseEncoder.NONE,
                       dimension=dimension, metric=metric)  # fmt: skip


def test_a_cosine_query_reaches_the_store_as_sent_where_float32_can_sum_its_squares():
    """Its stored copy is the same float32 array, whose cosine the store computes as
    exactly 1; out of float32's range it goes at unit length (its cosines the same)."""
    space = _fixed(Metric.COSINE, 2)
    assert space.query([3.0, 4.0], "vector") == ([3.0, 4.0], 0.0)
    assert space.query(np.array([3.0, 4.0]), "vector")[0] == [3.0, 4.0]
    for scale in (1e20, 1e-25):
        values, _ = space.query([3.0 * scale, 4.0 * scale], "vector")
        assert values == pytest.approx([0.6, 0.8])


def test_a_dot_product_within_float32_s_rounding_below_1_scores_1_and_no_score_passes_another():
    space = _fixed(Metric.DOT_PRODUCT, 384)
    bound = 386 * 2.0**-24 / (1 - 386 * 2.0**-24)
    assert space.score(1.0 - 3 * 2.0**-24, 0.0, 384) == 1.0  # pgvector's own, measured
    assert space.score(1.0 - bound, 0.0, 384) == 1.0
    assert space.score(1.0 - 2 * bound, 0.0, 384) == (2.0 - 2 * bound) / 2
    assert space.score(1.0 - 3 * 2.0**-24, 0.0, 0) < 1.0  # no dimension, no bound
    similarities = sorted([-1.5, -1.0, 0.0, 0.5, 0.99, 1 - 2 * bound, 1 - bound, 1 - 2.0**-24, 1.0, 3.0])
    scores = [space.score(s, 0.0, 384) for s in similarities]
    assert scores == sorted(scores) and scores[0] == 0.0 and scores[-1] == 1.0


@pytest.mark.parametrize("metric", [Metric.COSINE, Metric.EUCLIDEAN])
def test_cosine_and_euclidean_scores_are_not_rounded(metric):
    """Their identical vectors compute exactly 1 (cosine 1, distance 0): just below it is
    a score below 1."""
    space = _fixed(metric)
    below = 1.0 - 2.0**-23 if metric is Metric.COSINE else -(2.0**-20)
    assert space.score(below, 0.0, 384) < 1.0
    assert space.score(1.0 if metric is Metric.COSINE else 0.0, 0.0, 384) == 1.0
