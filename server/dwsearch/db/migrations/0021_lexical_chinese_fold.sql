-- Chat search's lexical leg folds Simplified and Traditional Chinese to one form
-- (dwsearch.retrieval.chinese: OpenCC's character table, from a package), in the terms the
-- sweep weighs a window by and in a query's, so that 频道 finds 頻道 and the reverse. The
-- windows weighed before the fold keep the terms of the script they were written in: this
-- gives them back to the leg's backfill (0014's path, dwsearch.sweep.store.lexical.backfill),
-- which weighs them again from their content, with the fold, a batch per org and model at a
-- time, as the sweep runs. Until then each is found by the other legs only, as a window
-- embedded before 0014 was.
--
-- Which windows: the fold's table is a package's, read at run time, so they are selected by
-- script: every window whose content has a character that could fold once NFKC-normalised
-- (as dwsearch.retrieval.bm25 normalises it): CJK ideographs and radicals, their
-- compatibility and enclosed forms (tests/retrieval/test_chinese_fold.py checks that every
-- character whose NFKC form the fold changes is in `chinese` below, as Postgres reads it).
-- A window of Simplified text only is among them, and is weighed again to the same weights.
--
-- Per org and model, as the leg's writers do (dwsearch.sweep.store.lexical): the windows'
-- rows locked first, then their terms uncounted in term order (the statement COUNT), their
-- projections deleted and their weights set to NULL, each statement naming its org (one
-- shard on Citus). On a large deployment this reads every window's content once and
-- rewrites those with Chinese text. Apply it while sweeps are paused, and resume them on
-- this release: a sweep of the release before would weigh the windows given back (and any
-- it writes) without the fold, and nothing would weigh them again. Searches go on.
-- One DO block, for the reason 0014 gives.
DO $lexical_chinese_fold$
DECLARE
    chinese constant text := '[\u2e80-\u2fdf\u3190-\u33ff\u3400-\u9fff\uf900-\ufaff\U0001f200-\U0001f2ff\U00020000-\U0003ffff]';
    pair record;
    refold uuid[];
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
    END IF;
    FOR pair IN SELECT DISTINCT org_id, model FROM dw_message_embeddings WHERE lexical IS NOT NULL
                ORDER BY org_id, model
    LOOP
        SELECT array_agg(w.id) INTO refold
        FROM (SELECT id FROM dw_message_embeddings
              WHERE org_id = pair.org_id AND model = pair.model AND lexical IS NOT NULL AND content ~ chinese
              FOR UPDATE) AS w;
        CONTINUE WHEN refold IS NULL;
        INSERT INTO dw_lexical_terms AS t (org_id, model, term, windows)
        SELECT g.org_id, g.model, terms.term, -count(*)::integer
        FROM dw_message_embeddings AS g,
             LATERAL (SELECT -1::bigint AS term
                      UNION ALL
                      SELECT split_part(p, ':', 1)::bigint - 1
                      FROM unnest(string_to_array(btrim(split_part(g.lexical::text, '/', 1), '{}'), ',')) AS p
                     ) AS terms
        WHERE g.org_id = pair.org_id AND g.id = ANY(refold)
        GROUP BY g.org_id, g.model, terms.term
        ORDER BY terms.term
        ON CONFLICT (org_id, model, term) DO UPDATE SET windows = t.windows + excluded.windows;
        DELETE FROM dw_lexical_windows WHERE org_id = pair.org_id AND id = ANY(refold);
        UPDATE dw_message_embeddings SET lexical = NULL WHERE org_id = pair.org_id AND id = ANY(refold);
    END LOOP;
END
$lexical_chinese_fold$;
