"""The REST API's JSON encoding (dwsearch.rest.encode): vectors as their shortest float32
decimals, written vector by vector, the rest as json.dumps writes it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dwsearch.rest.encode import Float32s, dumps


def test_vectors_are_written_as_their_shortest_float32_decimals():
    payload = {
        "result": [{"id": "a", "vector": Float32s([0.1, 0.2, 65505.0, 1e30, -0.0]), "score": 0.5}, None]
    }
    text = dumps(payload).decode()
    assert '"vector":[0.1,0.2,65505.0,1e+30,-0.0]' in text
    decoded = json.loads(text)
    assert decoded["result"][0]["vector"] == [0.1, 0.2, 65505.0, 1e30, -0.0]
    assert decoded["result"][0]["score"] == 0.5 and decoded["result"][1] is None
    # every value reads back as the float32 it was
    values = np.random.default_rng(1).standard_normal(500).astype(np.float32)
    back = json.loads(dumps([Float32s(values)]))[0]
    assert np.array_equal(np.asarray(back, dtype=np.float32), values)


def test_text_that_looks_like_a_placeholder_stays_text():
    # The placeholders carry a nonce of the call: a document cannot name one.
    sneaky = {"data": "\ue000deadbeefdeadbeef:0\ue001", "vector": Float32s([1.0])}
    decoded = json.loads(dumps({"result": [sneaky]}))
    assert decoded == {"result": [{"data": "\ue000deadbeefdeadbeef:0\ue001", "vector": [1.0]}]}


def test_without_vectors_it_is_json_dumps_and_refuses_what_json_refuses():
    payload = {"result": {"ok": "ünïcode", "n": [1, 2.5]}}
    assert dumps(payload) == json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    with pytest.raises(ValueError):
        dumps({"x": float("nan")})
    with pytest.raises(TypeError):
        dumps({"x": object()})
