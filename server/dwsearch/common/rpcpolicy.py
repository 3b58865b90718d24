"""What a call of our services needs to be let in, and how large its message may be: the
bearer tokens a server accepts and the scope each grants, the scope and request size limit
of each method (MethodPolicy), and the server-wide message size limit. Pure values; the
interceptor (dwsearch.common.interceptor) checks them on every call.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

# RPCs a client may call without credentials: Kubernetes' native gRPC probes send no
# metadata, and reflection only describes the API.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
# The largest message a call may receive or send, server-wide (GrpcHost's default).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class Scope(enum.IntEnum):
    """What a bearer token may call. Each scope includes the ones below it: an admin token
    may do everything, an index-write token may also search."""

    SEARCH = 1  # Search; IndexService reads and queries; BuildAgentContext
    INDEX = 2  # + IndexService writes (Upsert, Update, Delete)
    ADMIN = 3  # + SweepService (Sweep, Status, Purge, Forget, RetryPoison)


@dataclass(frozen=True)
class MethodPolicy:
    """What a method of our services requires: the scope of the caller's token, and the
    largest request message it takes (None: only the server-wide receive limit)."""

    scope: Scope = Scope.ADMIN
    max_request_bytes: int | None = None


# A method without a policy of its own: the narrowest door (an admin token), no limit of
# its own. The model services (embedder, reranker) have one token, which is an admin one.
DEFAULT_POLICY = MethodPolicy()


def parse_tokens(text: str) -> tuple[str, ...]:
    """Comma-separated tokens, blanks dropped."""
    return tuple(token.strip() for token in text.split(",") if token.strip())


class Tokens:
    """The bearer tokens a server accepts and the scope each grants. Several per scope at
    once, so a token can be rotated without downtime (add the new one, move the callers,
    remove the old one). A token listed under two scopes grants the wider one."""

    def __init__(self, scoped: Iterable[tuple[str, Scope]] = ()) -> None:
        granted: dict[bytes, Scope] = {}
        for token, scope in scoped:
            if token:
                header = f"Bearer {token}".encode()
                granted[header] = max(scope, granted.get(header, scope))
        self._entries = tuple(granted.items())

    @classmethod
    def single(cls, token: str) -> Tokens:
        """One token for everything (DWSEARCH_AUTH_TOKEN); empty = no auth."""
        return cls([(token, Scope.ADMIN)])

    @classmethod
    def from_settings(
        cls, *, all_scopes: str = "", search: str = "", index: str = "", admin: str = ""
    ) -> Tokens:
        """DWSEARCH_AUTH_TOKEN (one token, every scope) and the comma-separated
        DWSEARCH_SEARCH_TOKENS / _INDEX_TOKENS / _ADMIN_TOKENS."""
        scoped = [(all_scopes, Scope.ADMIN)]
        for text, scope in ((search, Scope.SEARCH), (index, Scope.INDEX), (admin, Scope.ADMIN)):
            scoped += [(token, scope) for token in parse_tokens(text)]
        return cls(scoped)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def scope_of(self, header: bytes | None) -> Scope | None:
        """The scope an `authorization` value grants, None when it is no token of ours.
        It is compared with every token, each in constant time (hmac.compare_digest),
        whichever matches."""
        if header is None:
            return None
        granted: Scope | None = None
        for token, scope in self._entries:
            if hmac.compare_digest(header, token) and (granted is None or scope > granted):
                granted = scope
        return granted
