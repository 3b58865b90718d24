-- What chat search's lexical leg scans (dwsearch.search.store.knn.lexical_knn): each
-- window's BM25 weights with the columns a search filters windows by, in a narrow table of
-- its own. Beside a dense vector of 1024 dimensions a dw_message_embeddings row is about
-- 2.4 kB, three to a page, and the leg, which scores every window of the org, read all of
-- them: 1,673 buffers for an org of 5,000 windows, against 158 here. Measured on that org
-- (Intel Xeon, x86-vnni): the leg's statement 4.2 -> 2.2 ms p50.
--
-- dw_message_embeddings.lexical stays the weights' record: the writers that count terms
-- (dwsearch.sweep.store.lexical) lock and read the window's own row, and its partial index
-- finds the windows still to backfill. This table is its projection, written in the same
-- transaction as the weights (dwsearch.sweep.store.lexical.project), and a window's row here
-- goes with the window (ON DELETE CASCADE).
--
-- On a large deployment the copy below reads every window once. A window that a sweep of
-- the release before writes meanwhile (a rolling upgrade) has weights and no projection:
-- the next sweep finds it by its org's counts and projects it
-- (dwsearch.sweep.store.lexical.unprojected). One DO block, for the reason 0014 gives.
DO $lexical_windows$
DECLARE
    citus boolean := EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus');
BEGIN
    CREATE TABLE dw_lexical_windows (
        id                  uuid        NOT NULL,
        org_id              varchar     NOT NULL,
        model               varchar     NOT NULL,
        provider            varchar     NOT NULL,
        external_channel_id varchar     NOT NULL,
        window_start        timestamptz NOT NULL,
        window_end          timestamptz NOT NULL,
        lexical             sparsevec   NOT NULL
    );
    -- As 0015's: a long window's weights stay in the row. Set before the table is
    -- distributed, so that its shards copy it.
    ALTER TABLE dw_lexical_windows ALTER COLUMN lexical SET STORAGE MAIN;
    IF citus THEN
        -- Shards are created, filled and given their keys one after another in this transaction.
        SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
        PERFORM create_distributed_table('dw_lexical_windows', 'org_id', colocate_with => 'dw_sweep_windows');
    END IF;
    -- The weights already written, copied before the keys exist: the foreign key is then
    -- validated in one pass, where a key in place checks (and locks) each window's row.
    INSERT INTO dw_lexical_windows (id, org_id, model, provider, external_channel_id, window_start, window_end,
                                    lexical)
    SELECT id, org_id, model, provider, external_channel_id, window_start, window_end, lexical
    FROM dw_message_embeddings WHERE lexical IS NOT NULL;
    CREATE INDEX dw_lexical_windows_org_model_idx ON dw_lexical_windows (org_id, model);
    IF citus THEN
        -- Keys that include the distribution column, as 0013 gives every org table.
        ALTER TABLE dw_lexical_windows ADD PRIMARY KEY (org_id, id);
        ALTER TABLE dw_lexical_windows
            ADD CONSTRAINT dw_lexical_windows_window_fkey FOREIGN KEY (org_id, id)
            REFERENCES dw_message_embeddings (org_id, id) ON DELETE CASCADE;
    ELSE
        -- The cascade finds a deleted window's row by its id alone.
        ALTER TABLE dw_lexical_windows ADD PRIMARY KEY (id),
            ADD CONSTRAINT dw_lexical_windows_window_fkey FOREIGN KEY (id)
            REFERENCES dw_message_embeddings (id) ON DELETE CASCADE;
    END IF;
END
$lexical_windows$;
