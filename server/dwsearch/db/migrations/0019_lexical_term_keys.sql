-- 0017's index of the org's terms, on a function the planner knows is costly. As an
-- expression, the keys (sparsevec_out and two regexes over each row's weights) were costed
-- as a few operators, so on orgs of a few thousand windows the planner read the org's rows
-- through dw_lexical_windows_org_model_idx and computed the keys of each as a filter rather
-- than asking the GIN index: 83-93 ms for a rare term where the scan took 2-3 ms (8 orgs of
-- 5,000 windows, Intel Xeon, x86-vnni). Behind dw_lexical_term_keys, COST 10000, it asks
-- the index: 0.04-0.06 ms. PL/pgSQL, so that the planner never inlines the function into
-- the expression (an inlined SQL function's COST is lost). The keys are 0017's: each term
-- of the projection's weights (a sparsevec's 1-based index) qualified by hashtext(org_id).
--
-- The new index is built before the old one goes, so that the leg's by-term statements of
-- the release before (0017's expression) keep theirs until then. One DO block, for the
-- reason 0014 gives; on Citus the function is created on every node before the index.
DO $lexical_term_keys$
BEGIN
    CREATE FUNCTION dw_lexical_term_keys(org_id varchar, lexical sparsevec) RETURNS text[]
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE COST 10000 AS $keys$
    BEGIN
        RETURN string_to_array(regexp_replace(regexp_replace(btrim(split_part(lexical::text, '/', 1), '{}'),
                                                             ':[^,]*', '', 'g'),
                                              '([0-9]+)', hashtext(org_id) || ':\1', 'g'), ',');
    END
    $keys$;
    CREATE INDEX dw_lexical_windows_term_keys_idx ON dw_lexical_windows
        USING gin (dw_lexical_term_keys(org_id, lexical));
    DROP INDEX dw_lexical_windows_terms_idx;
END
$lexical_term_keys$;
