"""DocumentIndex: the index's operations over the pool and its vector space's encoders
(dwsearch.index.space: the embedder, BM25, or vectors the caller gives). Every request is
checked in full before anything is embedded or written; text is PII-redacted before it
is embedded or stored; each write is one transaction; a query's text is embedded once.

One class, three modules along its seams: the shared parts (dwsearch.index.base), the
writes (dwsearch.index.writes) and the reads (dwsearch.index.reads)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.embedder import EmbedderClient, ModelInfo
from dwsearch.clients.querycache import QueryCache
from dwsearch.db.readpool import ReadPool
from dwsearch.index.reads import IndexReads
from dwsearch.index.space import VectorSpace
from dwsearch.index.writes import IndexWrites
from dwsearch.redaction import REDACTION_ON, Redaction
from dwsearch.retrieval.queries import QueryEmbedders


class DocumentIndex(IndexWrites, IndexReads):
    """An index of typed documents over one vector space: every write and read of the
    support app's index (IndexService, the REST API, agent context, knowledge gaps)."""


@dataclass(frozen=True)
class IndexParts:
    """What every DocumentIndex of a process shares, built once by serve's composition root
    (dwsearch.serve.build_application): the pool (writes), the read pool (queries, fetches,
    ranges: the read replica's when there is one), the embedder, redaction and the query
    cache. The chat index and each REST index are made from it (`index`)."""

    pool: AsyncConnectionPool
    embedder: EmbedderClient | None = None
    read_pool: ReadPool | AsyncConnectionPool | None = None
    redaction: Redaction = REDACTION_ON
    query_cache: QueryCache | None = None
    queries: QueryEmbedders | None = None
    """The process's query embedders (serve's, shared with chat search): an index of a
    served model embeds its queries through that model's, with its deadline and breaker."""

    def index(
        self,
        *,
        model: str = "",
        space: VectorSpace | None = None,
        query_slots: asyncio.Semaphore | None = None,
        on_model_info: Callable[[ModelInfo], object] | None = None,
    ) -> DocumentIndex:
        """A DocumentIndex over these parts: `model`'s own space, or `space` (a space that
        needs no embedder is given none)."""
        needs_embedder = space is None or space.needs_embedder
        queries = (
            self.queries.for_model(space.model if space is not None else model)
            if needs_embedder and self.queries is not None
            else None
        )
        return DocumentIndex(
            self.pool,
            self.embedder if needs_embedder else None,
            model=model,
            space=space,
            redaction=self.redaction,
            query_cache=self.query_cache,
            on_model_info=on_model_info,
            query_slots=query_slots,
            read_pool=self.read_pool,
            queries=queries,
        )
