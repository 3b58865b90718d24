"""The support app's index of typed documents (docs/design.md, "Support index"):
conversations, knowledge articles and trusted responses with JSON metadata, dense +
sparse vectors, namespaces.

- dwsearch.index.filter          the metadata filter expression language: parse, compile
                                 to Postgres jsonb SQL, evaluate in Python
- dwsearch.index.metadata        metadata checks and JSON merge patch
- dwsearch.index.documents       plain data types and request checks
- dwsearch.index.store           SQL over dw_index_documents
- dwsearch.index.space           VectorSpace: the model column, the encoders (embedder,
                                 BM25, vectors given) and the metric's vector maps and score
- dwsearch.index.document_index  DocumentIndex: upsert, query, fetch, delete, range, update,
                                 info; one class over any space (hybrid fusion:
                                 dwsearch.retrieval.fusion)
- dwsearch.index.context         agent context: its three section queries, optionally reranked
- dwsearch.index.gaps            knowledge gaps: recorded for opted-in orgs, listed grouped
                                 by similarity, forgotten
- dwsearch.index.gapstore        SQL over dw_knowledge_gaps
- dwsearch.index.service         the IndexService servicer
- dwsearch.index.commands        the `dwsearch gaps` client command
"""
