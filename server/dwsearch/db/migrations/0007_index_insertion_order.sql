-- A REST index's Range pages in insertion order, as Upstash's do (the SDK suites read
-- id-0, id-1, id-2 … back in the order they were upserted, not id-0, id-1, id-10): each
-- row's place in the order of first insertion (a replace keeps it, as it keeps created_at).
-- The gRPC IndexService's Range keeps id order.
ALTER TABLE dw_index_documents ADD COLUMN seq bigserial;
CREATE INDEX dw_index_documents_seq_idx ON dw_index_documents (namespace, model, seq);
