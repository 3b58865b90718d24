"""The retrieval engine's SQL, shared by chat search and the Index: nearest-neighbour
statements (nearest) and the HNSW indexes' DDL (hnsw). The corpora's own statements
(their scopes, tables and rows) stay in dwsearch.search.store and dwsearch.index.store."""
