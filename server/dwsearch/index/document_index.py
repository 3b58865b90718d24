"""DocumentIndex: the index's operations over the pool and its vector space's encoders
(dwsearch.index.space: the embedder, BM25, or vectors the caller gives). Every request is
checked in full before anything is embedded or written; text is PII-redacted before it
is embedded or stored; each write is one transaction; a query's text is embedded once.

One class, three modules along its seams: the shared parts (dwsearch.index.base), the
writes (dwsearch.index.writes) and the reads (dwsearch.index.reads)."""

from __future__ import annotations

from dwsearch.index.reads import IndexReads
from dwsearch.index.writes import IndexWrites


class DocumentIndex(IndexWrites, IndexReads):
    """An index of typed documents over one vector space: every write and read of the
    support app's index (IndexService, the REST API, agent context, knowledge gaps)."""
