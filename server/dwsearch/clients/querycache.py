"""The query-embedding cache of `serve`: a query string the server has embedded once
(Search, an Index query, BuildAgentContext's message) is not sent to the embedder again
while it stays in the cache. An agent that repeats a search costs no embedding.

Keyed by (model, the text exactly as sent — already redacted —, the vector kinds asked
for, truncation); bounded in bytes (DWSEARCH_QUERY_CACHE_BYTES), least recently used
first out. Only successful embeddings are stored. Vectors depend only on the model and
the input, so an entry never goes stale; a model swap changes the key."""

from __future__ import annotations

from typing import NamedTuple

from dwsearch.clients.embedder import Embedding
from dwsearch.common import metrics
from dwsearch.common.lru import ByteLru

# What an entry costs besides its vectors and text: the key tuple, the Embedding, the
# dict and array headers (measured with sys.getsizeof: about 600 bytes). Counted so
# that a bound also holds for many tiny entries.
ENTRY_OVERHEAD_BYTES = 640
# A sparse weight as held: an int key and a float value in a dict (about 100 bytes in
# CPython objects; bge-m3 queries have tens of them).
SPARSE_ENTRY_BYTES = 100


class _Key(NamedTuple):
    model: str
    text: str
    dense: bool
    sparse: bool
    truncate: bool


def entry_bytes(key: _Key, embedding: Embedding) -> int:
    size = ENTRY_OVERHEAD_BYTES + len(key.model.encode()) + len(key.text.encode())
    if embedding.dense is not None:
        size += embedding.dense.nbytes
    if embedding.sparse is not None:
        size += SPARSE_ENTRY_BYTES * len(embedding.sparse)
    return size


class QueryCache:
    """At most `max_bytes` of query embeddings; 0 = off (every query is embedded)."""

    def __init__(self, max_bytes: int) -> None:
        self._lru: ByteLru[_Key, Embedding] = ByteLru(max_bytes)

    @property
    def enabled(self) -> bool:
        return self._lru.max_bytes > 0

    @property
    def bytes(self) -> int:
        return self._lru.bytes

    def __len__(self) -> int:
        return len(self._lru)

    def get(
        self, model: str, text: str, *, dense: bool = True, sparse: bool, truncate: bool = True
    ) -> Embedding | None:
        """The cached embedding, counted as a hit; None (counted as a miss) otherwise."""
        if not self.enabled:
            return None
        found = self._lru.get(_Key(model, text, dense, sparse, truncate))
        (metrics.QUERY_CACHE_HITS if found is not None else metrics.QUERY_CACHE_MISSES).inc()
        return found

    def put(
        self,
        model: str,
        text: str,
        embedding: Embedding,
        *,
        dense: bool = True,
        sparse: bool,
        truncate: bool = True,
    ) -> None:
        if not self.enabled:
            return
        key = _Key(model, text, dense, sparse, truncate)
        if embedding.dense is not None:
            embedding.dense.flags.writeable = False  # shared by every later hit
        self._lru.put(key, embedding, entry_bytes(key, embedding))
        metrics.QUERY_CACHE_BYTES.set(self._lru.bytes)
