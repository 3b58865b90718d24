-- The lexical leg's projection (dw_lexical_windows, 0016) stored uncompressed. Beside a
-- dense vector of 1024 dimensions (storage PLAIN) a dw_message_embeddings row passes the
-- toast threshold, and its weights (storage MAIN) are compressed when they compress: about
-- half of them. 0016's copy and the sweeps since copied those compressed values as they
-- were, and a narrow row keeps a compressed value it is given, so the leg's scan, which
-- scores every window of the org, decompressed each of them at every search. The projection
-- now copies the weights as a new value (dwsearch.sweep.store.lexical.PROJECT); this gives
-- the rows already written theirs. Measured on an org of 5,000 windows, 2,759 of them
-- compressed (Intel Xeon, x86-vnni): the leg's statement 1.88 -> 1.50 ms (EXPLAIN ANALYZE).
--
-- Only the compressed rows are rewritten (and their entries in 0017's index). Citus refuses
-- a distributed UPDATE that calls a STABLE function on a column (pg_column_compression): on
-- a coordinator each shard is rewritten by run_command_on_shards, on connections of its own
-- (as 0015's SET STORAGE; a shard rewritten before a failure stays rewritten, which changes
-- no value), and a shard that fails fails the migration. One DO block, for the reason 0014
-- gives.
DO $lexical_uncompressed$
DECLARE
    rewrite constant text := 'UPDATE %s SET lexical = lexical::text::sparsevec '
                             'WHERE pg_column_compression(lexical) IS NOT NULL';
    failed text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        SELECT string_agg(result, '; ') INTO failed
        FROM run_command_on_shards('dw_lexical_windows', rewrite) WHERE NOT success;
        IF failed IS NOT NULL THEN
            RAISE EXCEPTION 'dw_lexical_windows: a shard was not rewritten: %', failed;
        END IF;
    ELSE
        EXECUTE format(rewrite, 'dw_lexical_windows');
    END IF;
END
$lexical_uncompressed$;
