"""A REST body's JSON, parsed so that an upsert's vectors never sit in memory as Python floats.

json.loads makes every number of a body a Python float in a list: 32 bytes for each, where
the body spent 7 or 8 characters on it. An upsert of 1,000 vectors of 15,999 dimensions
(82 MiB of JSON) became 512 MiB of floats, and serve peaked at ten times the body. Here a
body that is an array is parsed one element at a time (the standard library's own scanner,
JSONDecoder.raw_decode), and each element's `vector` is turned into a float64 array as soon
as it is parsed: 8 bytes a number, the very doubles json.loads would have made. The parsed
body then costs about 1.6 times the raw one, and the raw bytes are freed once decoded.

Only a list of plain JSON numbers becomes an array; anything else (strings, booleans, null,
nested lists, an integer beyond float range) is left as json.loads leaves it, for the
endpoint to refuse with its usual message. Whatever is not an element's `vector` (ids,
metadata, a metadata key that happens to be named `vector`, sparse vectors) is exactly what
json.loads makes. A body that is not one array is json.loads's."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace, as json.decoder skips it


def _skip(text: str, pos: int) -> int:
    """The first position at or after `pos` that is not whitespace."""
    match = _WHITESPACE.match(text, pos)
    return match.end() if match else pos


def decode(raw: bytes | bytearray) -> str:
    """The body's text, in the encoding JSON allows (UTF-8, -16 or -32), as json.loads
    decodes bytes."""
    return raw.decode(json.detect_encoding(raw), "surrogatepass")


def loads(text: str, *, vectors: str = "") -> Any:
    """`text` parsed as json.loads parses it, except that with `vectors` set, the field of
    that name of the top-level object (or of each object of a top-level array) holding only
    numbers is a 1-D float64 array. ValueError (JSONDecodeError) where json.loads raises it."""
    if not vectors:
        return json.loads(text)
    start = _skip(text, 0)
    if not text.startswith("[", start):
        return _compact(json.loads(text), vectors)
    items: list[Any] = []
    pos = _skip(text, start + 1)
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            item, pos = _DECODER.raw_decode(text, pos)
            items.append(_compact(item, vectors))
            pos = _skip(text, pos)
            if text.startswith(",", pos):
                pos = _skip(text, pos + 1)
                continue
            if text.startswith("]", pos):
                pos += 1
                break
            raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
    end = _skip(text, pos)
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return items


def _compact(item: Any, field: str) -> Any:
    if isinstance(item, dict):
        values = item.get(field)
        if isinstance(values, list) and values:
            array = numbers(values)
            if array is not None:
                item[field] = array
    return item


def numbers(values: list[Any]) -> np.ndarray | None:
    """`values` as a 1-D float64 array when every one is a JSON number (an int or a float,
    not a bool) within float range: each the double float() makes of it. None otherwise."""
    try:
        array = np.array(values)
    except (ValueError, TypeError, OverflowError):  # ragged, or mixed beyond numpy's types
        return None
    if array.ndim != 1 or array.dtype.kind not in "fi":  # strings, objects, bools, nested lists
        return None
    if array.dtype.kind == "i":
        array = array.astype(np.float64)
    elif array.dtype != np.float64:
        return None
    # A bool among numbers becomes 0 or 1: look at those (few) places only.
    for i in np.flatnonzero((array == 0) | (array == 1)):
        if isinstance(values[i], bool):
            return None
    return array
