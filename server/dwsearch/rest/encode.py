"""The REST API's JSON responses, vectors written in pieces.

A response of many documents with their vectors (a fetch of 1,000 vectors of 4,000
dimensions is 15 MiB of JSON) costs most in its numbers. Written by `json.dumps` over
lists of Python floats, the encoding is one C call that holds the interpreter lock for
seconds, in a pool thread as on the event loop, and every other request on the port waits
for it. Here a document's dense vector stays a float32 array (`Float32s`) until encoding;
`dumps` writes the rest of the response with `json.dumps`, each vector with numpy (the
shortest decimal that reads back as the same float32, as Upstash writes them: 0.1, not
0.10000000149011612) in its own call, so the lock changes hands between vectors and the
loop goes on answering while a large response is written in the CPU pool."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import numpy as np


class Float32s:
    """A dense vector in a response: its float32 values, written as JSON numbers."""

    __slots__ = ("values",)

    def __init__(self, values: Any) -> None:
        self.values = np.asarray(values, dtype=np.float32)

    def json(self) -> str:
        return "[" + ",".join(self.values.astype(str).tolist()) + "]"


def dumps(payload: Any) -> bytes:
    """`payload` as compact UTF-8 JSON (no NaN), each Float32s written as its numbers."""
    vectors: list[Float32s] = []
    # A placeholder string per vector, marked by a nonce no request can guess.
    nonce = secrets.token_hex(8)

    def placeholder(value: Any) -> str:
        if not isinstance(value, Float32s):
            raise TypeError(f"{type(value).__name__} is not JSON serializable")
        vectors.append(value)
        return f"\ue000{nonce}:{len(vectors) - 1}\ue001"

    text = json.dumps(
        payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=placeholder
    )
    if not vectors:
        return text.encode()
    pattern = re.compile(f'"\ue000{nonce}:(\\d+)\ue001"')
    return pattern.sub(lambda m: vectors[int(m.group(1))].json(), text).encode()
