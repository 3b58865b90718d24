"""Forget's request rules, shared by the server and the `dwsearch forget` client (which
checks them before calling, as `purge` checks its cutoff)."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from dwsearch.common.errors import InvalidArgument

# Distinct message ids one Forget call takes.
MAX_FORGET_IDS = 10_000


def parse_message_ids(message_ids: Sequence[str]) -> list[UUID]:
    """At least one id, each a UUID (any spelling uuid.UUID reads), at most
    MAX_FORGET_IDS distinct; InvalidArgument naming the first bad one otherwise."""
    if not message_ids:
        raise InvalidArgument("message_ids is required")
    ids = set()
    for i, text in enumerate(message_ids):
        try:
            ids.add(UUID(text))
        except ValueError:
            raise InvalidArgument(f"message_ids[{i}] = {text[:64]!r} is not a dw_chat_events id (UUID)") from None
    if len(ids) > MAX_FORGET_IDS:
        raise InvalidArgument(f"{len(ids)} distinct message_ids; at most {MAX_FORGET_IDS} per call")
    return sorted(ids)
