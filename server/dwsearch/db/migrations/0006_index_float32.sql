-- A REST index whose vectors come with the requests (dwsearch.index.space: a fixed space)
-- keeps them as the caller sent them, in float32 as Upstash does: [0.1, 0.2] reads back
-- [0.1, 0.2], and an identical vector scores exactly 1. Its `embedding` then holds a
-- one-zero placeholder (NOT NULL). The gRPC index and the indexes the embedder fills keep
-- halfvec. Rows written before this migration are carried over by `dwsearch serve` at
-- start (store.carry_over_float32: the halfvec values, less a EUCLIDEAN index's |x|²).
ALTER TABLE dw_index_documents ADD COLUMN vector32 vector;
