-- Per-org HNSW indexes (dwsearch.search.knnindex; docs/design.md, "Storage and KNN"): an
-- org with at least KNN_INDEX_MIN_WINDOWS live windows of a model gets a partial HNSW
-- index of its own (WHERE model = ... AND org_id = ...), built by `dwsearch knn-indexes`.
-- A row is written only after its index was built and is valid, and deleted before the
-- index is dropped; search (knn_index = auto) uses an org's index only when a row names it
-- for the query's model and dimension, and falls back to exact KNN otherwise.
CREATE TABLE dw_knn_indexes (
    org_id           varchar     NOT NULL,
    model            varchar     NOT NULL,
    -- The halfvec dimension the index casts to; a query of another dimension is exact.
    dimension        integer     NOT NULL,
    index_name       text        NOT NULL,
    -- Live windows of the org and model when the index was built.
    windows_at_build bigint      NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, model)
);
