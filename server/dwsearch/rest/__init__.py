"""The Upstash-Vector-compatible REST API (issue 17), transport over the index's domain
layer (dwsearch.index), served by `dwsearch serve --rest-port`:

- dwsearch.rest.app        the ASGI app: tokens, the endpoint table, limits, JSON, statuses
- dwsearch.rest.upstash    one index's Upstash requests and answers as DocumentIndex calls
- dwsearch.rest.resumable  resumable-query state
- dwsearch.rest.indexfile     the index file (DWSEARCH_REST_INDEXES)
- dwsearch.rest.server     the uvicorn host
"""
