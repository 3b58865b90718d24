"""Document metadata: any JSON object. Checked and normalized before it is stored, and
patched with JSON merge patch (RFC 7396) — pure functions over plain data."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from dwsearch.common.errors import InvalidArgument

MAX_METADATA_BYTES = 48 * 1024
"""Serialized JSON size of one document's metadata (Upstash Vector's limit)."""

MAX_EXACT_INTEGER = 2**53
"""Doubles at or below this magnitude hold integers exactly."""

MAX_METADATA_DEPTH = 32
"""Objects and arrays nested in one document's metadata, the outermost object included.
Deeper Structs stop parsing at protobuf's depth limit (about 32 objects or 48 lists): the
interceptor answers those INVALID_ARGUMENT too."""


def check_metadata(metadata: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A JSON object Postgres can store: finite numbers, no NUL characters, at most
    MAX_METADATA_BYTES and MAX_METADATA_DEPTH. Integral numbers become ints — protobuf's
    Struct carries every number as a double, and 3.0 stored as 3.0 breaks readers that
    decode into an integer field (Go's encoding/json does)."""
    normalized: dict[str, Any] = _normalized(dict(metadata), where, 1)
    size = len(json.dumps(normalized, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MAX_METADATA_BYTES:
        raise InvalidArgument(f"{where}: {size} bytes of JSON; the limit is {MAX_METADATA_BYTES}")
    return normalized


def _normalized(value: Any, where: str, depth: int) -> Any:
    if isinstance(value, Mapping | list | tuple) and depth > MAX_METADATA_DEPTH:
        raise InvalidArgument(f"{where}: nested more than {MAX_METADATA_DEPTH} objects or arrays deep")
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        if "\x00" in value:  # Postgres text and jsonb cannot hold NUL
            raise InvalidArgument(f"{where}: NUL character in a string")
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument(f"{where}: {value} is not a JSON number")
        return int(value) if value.is_integer() and abs(value) <= MAX_EXACT_INTEGER else value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or "\x00" in key:
                raise InvalidArgument(f"{where}: keys must be strings without NUL characters")
            out[key] = _normalized(item, f"{where}.{key}", depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_normalized(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    raise InvalidArgument(f"{where}: {type(value).__name__} is not a JSON value")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396: objects merge recursively, null removes a member, anything else replaces."""
    if not isinstance(patch, Mapping):
        return patch
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
