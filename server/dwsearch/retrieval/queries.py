"""Query embedding for both corpora: one QueryEmbedder per served model, built once (by
serve's composition root) and handed to chat search and to every index, REST ones
included, so that a query's embedding is bounded and degrades the same way whoever asks.

Each model's QueryEmbedder (dwsearch.clients.queryembedder) has:
- the query-embedding deadline (DWSEARCH_EMBED_TIMEOUT_MS), on its Info too: a frozen
  embedder costs a query that long, never a client's default of seconds;
- a circuit breaker of its own: an embedder that keeps failing for a model is not called
  for a while, and every query answers at once with what needs no embedder (chat search
  with full text, a HYBRID index with its BM25 leg) or UNAVAILABLE;
- the process's query cache: a repeated query costs no embedding, even while the circuit
  is open.
"""

from __future__ import annotations

from collections.abc import Callable

from dwsearch.clients.breaker import CircuitBreaker
from dwsearch.clients.embedder import EmbedderClient, ModelInfo
from dwsearch.clients.querycache import QueryCache
from dwsearch.clients.queryembedder import QueryEmbedder
from dwsearch.common.errors import DeadlineExceeded, DwsearchError, Unavailable
from dwsearch.retrieval.degradation import Degradation

DEFAULT_EMBED_TIMEOUT_S = 0.3
"""The query-embedding deadline when none is given (ServerConfig.embed_timeout_ms's default)."""


class QueryEmbedders:
    """The process's query embedders, one per model, each made on first use and kept."""

    def __init__(
        self,
        embedder: EmbedderClient,
        *,
        timeout: float = DEFAULT_EMBED_TIMEOUT_S,
        cache: QueryCache | None = None,
        first_model: str = "",
        first_breaker: CircuitBreaker | None = None,
        on_first_info: Callable[[ModelInfo], object] | None = None,
        on_embed_seconds: Callable[[float], object] | None = None,
    ) -> None:
        """`first_model`: the first active model, whose breaker keeps the name "embedder"
        (`first_breaker` when given) and whose Info is told to `on_first_info` (serve's
        check of the embedder's query latency against the deadline); another model's
        breaker is "embedder:<model>", so that one slow or missing model opens no other's
        circuit."""
        self.embedder = embedder
        self.timeout = timeout
        self.cache = cache if cache is not None else QueryCache(0)
        self._first = first_model
        self._first_breaker = first_breaker
        self._on_first_info = on_first_info
        self._on_embed_seconds = on_embed_seconds
        self._by_model: dict[str, QueryEmbedder] = {}

    def for_model(self, model: str) -> QueryEmbedder:
        """`model`'s query embedder (a client that asks for it and checks every answer names
        it), the same object for every caller."""
        found = self._by_model.get(model)
        if found is None:
            first = model == self._first or not self._first
            breaker = (self._first_breaker if first else None) or CircuitBreaker(
                "embedder" if first else f"embedder:{model}"
            )
            found = QueryEmbedder(
                self.embedder.for_model(model),
                cache=self.cache,
                breaker=breaker,
                timeout=self.timeout,
                on_info=self._on_first_info if first else None,
                on_embed_seconds=self._on_embed_seconds,
            )
            if not self._first:
                self._first = model
            self._by_model[model] = found
        return found


def left_out(exc: DwsearchError, detail: str = "") -> tuple[Degradation, str]:
    """Why a query's embedding legs are left out: the embedder timed out (the deadline), or
    failed or its circuit is open. `detail` names the model where several are active."""
    reason = (
        Degradation.EMBEDDER_TIMEOUT
        if isinstance(exc, DeadlineExceeded)
        else Degradation.EMBEDDER_UNAVAILABLE
    )
    return reason, f"{detail}: {exc}" if detail else str(exc)


def degrades(exc: DwsearchError) -> bool:
    """A failure of the query's embedding that the answer degrades on (the embedder late,
    down or its circuit open), rather than one the caller is told of as it is."""
    return isinstance(exc, (DeadlineExceeded, Unavailable))
