"""SearchService: full-text search over dw_chat_events merged with dense and sparse KNN
over embedded conversation windows, fused with reciprocal rank fusion, optionally
reranked, and degraded (never failed) when a semantic source is unavailable."""
