"""dwsearch.rest.jsonbody: an upsert's body parsed as json.loads parses it, each document's
`vector` of plain numbers a float64 array of the very doubles json.loads makes, anything
else exactly json.loads's, and a body json.loads refuses refused."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dwsearch.rest import jsonbody


def plain(value):
    """`value` with its arrays as lists of floats (NaN as a string, to compare)."""
    if isinstance(value, np.ndarray):
        assert value.dtype == np.float64 and value.ndim == 1
        return [plain(v) for v in value.tolist()]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def check(parsed, expected) -> None:
    """`parsed` is json.loads's `expected`, value for value and type for type, but where it
    holds an array: there, the doubles float() makes of expected's numbers."""
    if isinstance(parsed, np.ndarray):
        assert isinstance(expected, list)
        assert plain(parsed) == plain([float(v) for v in expected])
        return
    assert type(parsed) is type(expected)
    if isinstance(parsed, list):
        assert len(parsed) == len(expected)
        for p, e in zip(parsed, expected, strict=True):
            check(p, e)
    elif isinstance(parsed, dict):
        assert list(parsed) == list(expected)
        for key in parsed:
            check(parsed[key], expected[key])
    else:
        assert plain(parsed) == plain(expected)


def same_as_json(text: str):
    parsed = jsonbody.loads(text, vectors="vector")
    check(parsed, json.loads(text))
    return parsed


NUMBERS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**70), max_value=2**70),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=5))
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["vector", "id", "x"]), inner, max_size=3)
    ),
    max_leaves=12,
)
VECTORS = st.one_of(
    st.lists(NUMBERS, max_size=6),  # arrays
    st.lists(st.one_of(NUMBERS, SCALARS, st.lists(NUMBERS, max_size=2)), max_size=5),  # mostly not
)
ITEMS = st.one_of(
    st.fixed_dictionaries({"id": st.text(max_size=3), "vector": VECTORS}, optional={"metadata": JSON}),
    JSON,
)
SPACES = st.sampled_from(["", " ", "\n", " \t\r\n "])


@settings(max_examples=400, deadline=None)
@given(st.lists(ITEMS, max_size=5) | ITEMS, SPACES, SPACES)
def test_any_body_parses_as_json_loads_parses_it(body, space, separator_space):
    text = json.dumps(body, separators=(separator_space + "," + space, ":" + space))
    same_as_json(space + text + space)


def test_a_documents_vector_of_numbers_is_a_float64_array_of_the_doubles_json_makes():
    text = '[{"id": "a", "vector": [0.1, -2, 1e-320, 12345678901234567890, 1.5E+3, 0], "metadata": {"vector": [1.0]}},'
    text += ' {"id": "b", "vector": [1, 2]}, {"vector": []}]'
    a, b, empty = same_as_json(text)
    assert isinstance(a["vector"], np.ndarray) and isinstance(b["vector"], np.ndarray)
    assert a["vector"].tolist() == [0.1, -2.0, 1e-320, 12345678901234567890.0, 1500.0, 0.0]
    assert a["metadata"] == {"vector": [1.0]}  # metadata is never touched
    assert empty["vector"] == []
    (huge,) = same_as_json('[{"vector": [1e999, -1e999]}]')  # json.loads's infinities, refused later
    assert huge["vector"].tolist() == [math.inf, -math.inf]
    single = same_as_json('{"id": "one", "vector": [0.5, 0.25]}')
    assert isinstance(single["vector"], np.ndarray)


@pytest.mark.parametrize(
    "vector",
    [
        "[1.0, true]",
        "[0, false, 2]",
        "[true]",
        '[1.0, "2"]',
        "[1.0, null]",
        "[[1.0], [2.0]]",
        "[1.0, [2.0]]",
        "[1.0, {}]",
        "[" + "9" * 400 + "]",  # an int beyond float range is left for the endpoint's 400
        "[1.5, " + "9" * 400 + "]",
    ],
)
def test_anything_but_plain_numbers_is_left_as_json_loads_leaves_it(vector):
    (item,) = same_as_json('[{"id": "x", "vector": ' + vector + "}]")
    assert isinstance(item["vector"], list)


@pytest.mark.parametrize(
    "text",
    [
        "[",
        "[,]",
        "[1,]",
        "[1 2]",
        "[1,,2]",
        "[1] 2",
        "[1]]",
        "[{]",
        '[{"vector": [1,]}]',
        "[1]x",
        "",
        " ",
        "[NaN",
    ],
)
def test_what_json_loads_refuses_is_refused(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        jsonbody.loads(text, vectors="vector")


def test_the_body_is_decoded_as_json_loads_decodes_bytes():
    body = '[{"id": "é", "vector": [1.5]}]'
    for raw in (
        body.encode(),
        body.encode("utf-16"),
        b"\xef\xbb\xbf" + body.encode(),
        body.encode("utf-32-le"),
    ):
        assert plain(jsonbody.loads(jsonbody.decode(raw), vectors="vector")) == plain(json.loads(raw))


@pytest.mark.parametrize(
    "vector,message",
    [
        ("[0.5, true]", "vectors[1].vector: a list of numbers"),
        ('[0.5, "1"]', "vectors[1].vector: a list of numbers"),
        ("[0.5, null]", "vectors[1].vector: a list of numbers"),
        ("[[0.5], [1]]", "vectors[1].vector: a list of numbers"),
        ("[0.5, 1, 2]", "Invalid vector dimension: 3, expected: 2"),
        ("[]", "Invalid vector dimension: 0, expected: 2"),
        ("[0.5, " + "9" * 400 + "]", "vectors[1].vector: a number beyond the float range"),
        ("[0.5, 1e999]", "documents[1].vector: not finite (NaN or infinity)"),
        ("[0, 0]", "documents[1].vector: a zero vector has no cosine similarity"),
        (
            "[0.5, 1e39]",
            "documents[1].vector: a component is beyond ±3.40282e+38, the range of a stored float32 vector",
        ),
    ],
)
async def test_an_upserts_bad_vectors_are_refused_as_before(rest_url, vector, message):
    """The same 400s whether a vector was read as an array (numbers) or left a list (each
    message as the code before dwsearch.rest.jsonbody gave it)."""
    body = '[{"id": "ok", "vector": [0.5, 0.5]}, {"id": "bad", "vector": ' + vector + "}]"
    async with httpx.AsyncClient(base_url=rest_url) as http:
        auth = {"Authorization": "Bearer dense-token", "Content-Type": "application/json"}
        r = await http.post("/upsert", headers=auth, content=body)
    assert r.status_code == 400 and r.json()["error"] == message, r.text
