"""The Upstash-Vector-compatible REST API (issue 17): an ASGI app over the index's domain
layer (dwsearch.index), served by `dwsearch serve --rest-port`."""
