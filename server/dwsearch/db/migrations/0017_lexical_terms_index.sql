-- An inverted index for chat search's lexical leg (dwsearch.search.store.knn.lexical_knn):
-- GIN over each projection's terms, each qualified by its org ('<hashtext(org_id)>:<index>',
-- the index a sparsevec numbers the bm25 term by), so that one org's windows holding a term
-- are found without reading every other org's. Where the org's counts (dw_lexical_terms)
-- say the query's terms are in few of its windows, the leg reads those through this index
-- and scores them alone; where they are in many, it scans the org's windows as before. The
-- ranking is the same either way: the windows sharing no term score 0 and are left out.
--
-- An expression index, not a column: the rows the scan reads stay as narrow as 0016 made
-- them, and no writer keeps it. knn.py's statement spells the same expression
-- (_TERM_KEYS), as the planner must see it to use the index.
--
-- Measured on orgs of 50,000 windows of a Zipf-distributed vocabulary of 20,000 words
-- (Intel Xeon, x86-vnni): see docs/design.md, "The lexical leg". One DO block, for the
-- reason 0014 gives.
DO $lexical_terms_index$
BEGIN
    CREATE INDEX dw_lexical_windows_terms_idx ON dw_lexical_windows USING gin ((
        string_to_array(regexp_replace(regexp_replace(btrim(split_part(lexical::text, '/', 1), '{}'),
                                                      ':[^,]*', '', 'g'),
                                       '([0-9]+)', hashtext(org_id) || ':\1', 'g'), ',')
    ));
END
$lexical_terms_index$;
