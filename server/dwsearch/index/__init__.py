"""The support app's index of typed documents (docs/design.md, "Support index"):
conversations, knowledge articles and trusted responses with JSON metadata, dense +
sparse vectors, namespaces.

- dwsearch.index.filter     the metadata filter expression language: parse, compile to
                            Postgres jsonb SQL, evaluate in Python
- dwsearch.index.fusion     hybrid fusion of ranked lists: RRF and DBSF
- dwsearch.index.metadata   metadata checks and JSON merge patch
- dwsearch.index.documents  plain data types and request checks
- dwsearch.index.store      SQL over dw_index_documents
- dwsearch.index.index      DocumentIndex: upsert, query, fetch, delete, range, update, info
- dwsearch.index.context    agent context: its three section queries, optionally reranked
- dwsearch.index.service    the IndexService servicer
"""
