"""Length and count limits of the string fields serve's requests carry, checked before any
work: a request over one answers INVALID_ARGUMENT naming the field and the limit. (The
index's own fields — namespace, ids, texts, names — are checked in
dwsearch.index.documents.) The gRPC receive limit of each method (dwsearch.serve) bounds a
request as a whole; these bound what a field may cost once it is in a cache, a log line or
a query."""

from __future__ import annotations

from collections.abc import Sequence

from dwsearch.common.errors import InvalidArgument

MAX_ORG_ID_BYTES = 256
MAX_PROVIDER_BYTES = 256
MAX_CHANNEL_ID_BYTES = 512
MAX_MODEL_BYTES = 256
# A UUID as text, in any spelling uuid.UUID reads ("urn:uuid:…", braces, no dashes).
MAX_UUID_TEXT_BYTES = 64
# Ids one Forget (message ids) or RetryPoison (poison window ids) call takes, distinct.
MAX_IDS_PER_CALL = 10_000


def check_length(value: str, name: str, max_bytes: int) -> None:
    """InvalidArgument when `value` is over `max_bytes` bytes of UTF-8."""
    if len(value) * 4 <= max_bytes:  # no string of this many characters can be over
        return
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise InvalidArgument(f"{name}: {size} bytes; the limit is {max_bytes}")


def check_org_id(org_id: str, name: str = "org_id") -> None:
    check_length(org_id, name, MAX_ORG_ID_BYTES)


def distinct_ids(ids: Sequence[str], name: str, maximum: int = MAX_IDS_PER_CALL) -> list[str]:
    """The distinct ids of a request, in first-seen order, checked before any of them is
    parsed: each at most MAX_UUID_TEXT_BYTES, at most `maximum` distinct (a request may
    repeat an id; the repeats cost a set lookup each, not a parse)."""
    unique = list(dict.fromkeys(ids))
    if len(unique) > maximum:
        raise InvalidArgument(f"{name}: {len(unique)} distinct ids; at most {maximum} per call")
    for text in unique:
        if len(text) > MAX_UUID_TEXT_BYTES:
            raise InvalidArgument(
                f"{name}: an id of {len(text)} characters ({text[:64]!r}…); the limit is {MAX_UUID_TEXT_BYTES}"
            )
    return unique
