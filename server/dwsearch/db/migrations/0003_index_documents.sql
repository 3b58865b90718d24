-- The support app's index (seed 000): typed documents (conversation / knowledge /
-- response) with JSON metadata, in namespaces, with dense + sparse vectors.
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE dw_index_documents (
    namespace  varchar     NOT NULL,
    -- "C" collation: ids order by code point, so Range pages in a locale-independent
    -- order and an id prefix is a plain key range.
    id         varchar COLLATE "C" NOT NULL,
    -- The text, PII-redacted; '' for a document upserted as a vector only.
    data       text        NOT NULL,
    metadata   jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    -- Identity of the vector space of embedding and sparse; every read filters on it.
    model      varchar     NOT NULL,
    -- Dimension is per model, so the columns are unconstrained; exact KNN needs no typmod.
    embedding  halfvec     NOT NULL,
    -- bge-m3 lexical weights, where the model has them.
    sparse     sparsevec,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, id)
);

-- As for dw_message_embeddings: a halfvec(1024) is just over the TOAST threshold, and
-- keeping it in the heap row makes exact KNN 2-3x faster.
ALTER TABLE dw_index_documents ALTER COLUMN embedding SET STORAGE PLAIN;
-- And rows up to a page stay whole: with the default target (~2 KB) a row holding a
-- halfvec(1024) always crosses it, so Postgres moves metadata, sparse and data out of
-- line, and every filter and sparse score reads TOAST pages (100k documents: 129 ms ->
-- 27 ms for one filtered hybrid query).
ALTER TABLE dw_index_documents SET (toast_tuple_target = 8160);

-- Every agent-context query filters on appId and type (seed 000); the expressions are
-- written exactly as the filter compiler emits them, so the planner matches them.
CREATE INDEX dw_index_documents_app_type_idx
    ON dw_index_documents (namespace, model, (metadata ->> 'appId'), (metadata ->> 'type'));
