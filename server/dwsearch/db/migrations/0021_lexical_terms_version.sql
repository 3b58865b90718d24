-- Which term extraction weighed each window's lexical weights (chat search's lexical leg,
-- 0014): dw_message_embeddings.lexical_terms, dwsearch.sweep.store.lexical.LEXICAL_TERMS
-- as the writer had it, NULL for the extraction before this column (0014 to 0020). Version
-- 1 folds Simplified and Traditional Chinese to one form (dwsearch.retrieval.chinese), so
-- that 频道 finds 頻道 and the reverse; the windows weighed before it keep the terms of the
-- script they were written in until the sweep's backfill weighs them again.
--
-- No data is rewritten here. The sweep's backfill (dwsearch.sweep.store.lexical.backfill)
-- finds the windows of an older version by the partial index below, a probe per org and
-- model, and weighs them again from their content a batch at a time, as it weighs the
-- windows embedded before 0014: their old terms uncounted, their weights, version and
-- projection written anew, their new terms counted, in one transaction per batch. A window
-- whose weights come out the same (no Chinese text the fold changes) only gets its
-- version. A sweep of the release before this one, still running during a rolling
-- upgrade, writes windows without a version (NULL): the backfill finds those too, so
-- nothing needs pausing. Until a window is weighed again the other legs find it, and the
-- lexical leg by the terms it was weighed by.
--
-- The index's predicate is the backfill's, spelled the same (lexical.STALE, with the
-- version a constant, so that it is immutable): a change to how terms are made bumps
-- LEXICAL_TERMS, with a migration that builds the index of the new predicate and drops
-- this one. A sweep of an older version never takes a window of a newer one (a version
-- lower than its own is what it weighs again).
--
-- On a large deployment: ADD COLUMN (nullable, no default) is a catalog change, but it
-- waits for the table's running reads, and the sweep's window writes wait while the index
-- builds (one read of the table; searches go on). The index starts with every window that
-- has weights in it, and empties as the backfill goes. One DO block, for the reason 0014
-- gives: on Citus each statement reaches every shard.
DO $lexical_terms_version$
BEGIN
    ALTER TABLE dw_message_embeddings ADD COLUMN lexical_terms smallint;
    CREATE INDEX dw_message_embeddings_lexical_stale_idx ON dw_message_embeddings (org_id, model)
        WHERE lexical IS NOT NULL AND coalesce(lexical_terms, 0) < 1;
END
$lexical_terms_version$;
