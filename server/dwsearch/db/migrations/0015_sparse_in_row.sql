-- The sparse columns (bge-m3's weights, and the lexical leg's of migration 0014) are kept
-- in the row: storage MAIN, where pgvector's sparsevec defaults to EXTERNAL. Beside a dense
-- vector of 1024 dimensions a row passes the 2 kB toast threshold, and an EXTERNAL column
-- then goes out of line, so that scoring a window read three more pages. MAIN moves a column
-- out only when the row would not fit a page. Measured on one org of 5,000 windows (Intel
-- Xeon): the lexical leg's scan 13.6 -> 3.6 ms p50. Rows written before this keep their
-- storage until rewritten.
--
-- Citus does not propagate SET STORAGE ("alter table command is currently unsupported"): on
-- a coordinator it is set on the shell table (which new shards copy) with propagation off,
-- and on each shard by run_command_on_shards. That runs on connections of its own: it must
-- not share a migration with DDL that locks the shards (0014's ADD COLUMN), or it waits on
-- that transaction forever.
DO $storage$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.enable_ddl_propagation', 'off', true);
        ALTER TABLE dw_message_embeddings ALTER COLUMN lexical SET STORAGE MAIN,
                                          ALTER COLUMN sparse SET STORAGE MAIN;
        PERFORM set_config('citus.enable_ddl_propagation', 'on', true);
        PERFORM run_command_on_shards('dw_message_embeddings',
            'ALTER TABLE %s ALTER COLUMN lexical SET STORAGE MAIN, ALTER COLUMN sparse SET STORAGE MAIN');
    ELSE
        ALTER TABLE dw_message_embeddings ALTER COLUMN lexical SET STORAGE MAIN,
                                          ALTER COLUMN sparse SET STORAGE MAIN;
    END IF;
END
$storage$;
