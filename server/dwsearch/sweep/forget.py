"""Forget's request rules, shared by the server and the `dwsearch forget` client (which
checks them before calling, as `purge` checks its cutoff)."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from dwsearch.common.errors import InvalidArgument
from dwsearch.common.fields import MAX_IDS_PER_CALL, MAX_UUID_TEXT_BYTES

# Distinct message ids one Forget call takes.
MAX_FORGET_IDS = MAX_IDS_PER_CALL


def parse_message_ids(message_ids: Sequence[str]) -> list[UUID]:
    """At least one id, each a UUID (any spelling uuid.UUID reads), at most
    MAX_FORGET_IDS distinct; InvalidArgument naming the first bad one otherwise."""
    if not message_ids:
        raise InvalidArgument("message_ids is required")
    # Counted before any is parsed, repeats first dropped (1.5M copies of one id took 3.3 s
    # to parse one by one).
    distinct = dict.fromkeys(message_ids)
    if len(distinct) > MAX_FORGET_IDS:
        raise InvalidArgument(f"{len(distinct)} distinct message_ids; at most {MAX_FORGET_IDS} per call")
    ids = set()
    for i, text in enumerate(message_ids):
        if distinct[text] is not None:
            continue  # a repeat, already parsed
        distinct[text] = True
        try:
            if len(text) > MAX_UUID_TEXT_BYTES:
                raise ValueError(text)
            ids.add(UUID(text))
        except ValueError:
            raise InvalidArgument(
                f"message_ids[{i}] = {text[:64]!r} is not a dw_chat_events id (UUID)"
            ) from None
    return sorted(ids)
