-- Chat search's lexical leg (dwsearch.search.store.knn.lexical_knn): each window's BM25
-- weights over dwsearch.retrieval.bm25's tokens (words, and character bigrams for Chinese
-- and other CJK text), written by the sweep beside the dense vector; NULL for a window
-- embedded before this migration until the sweep backfills it from its content.
--
-- Per org and model, dw_lexical_terms holds in how many windows each lexical term occurs
-- (the IDF of a query's terms, read by index in one probe per term), and under term -1 how
-- many windows have lexical weights at all; kept in the transaction that writes or deletes
-- the windows (dwsearch.sweep.store.lexical).
--
-- On a large deployment: ADD COLUMN (no default) is a catalog change, but it waits for the
-- table's running reads and holds sweep writes while the partial index builds, and that
-- index starts with every window in it (all of them are to backfill). Apply it while
-- sweeps are paused; searches go on once it is done.
--
-- One DO block: on a Citus coordinator each DDL statement then reaches the shards as its
-- own command (a file of several statements is one query string, which Citus would send
-- to the workers whole).
DO $lexical$
BEGIN
    ALTER TABLE dw_message_embeddings ADD COLUMN lexical sparsevec;
    -- The windows still to backfill, found without reading the others (empty once done).
    CREATE INDEX dw_message_embeddings_lexical_backfill_idx ON dw_message_embeddings (org_id, model)
        WHERE lexical IS NULL;
    CREATE TABLE dw_lexical_terms (
        org_id  varchar NOT NULL,
        model   varchar NOT NULL,
        term    bigint  NOT NULL,
        windows integer NOT NULL,
        PRIMARY KEY (org_id, model, term)
    );
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM create_distributed_table('dw_lexical_terms', 'org_id', colocate_with => 'dw_sweep_windows');
    END IF;
END
$lexical$;
