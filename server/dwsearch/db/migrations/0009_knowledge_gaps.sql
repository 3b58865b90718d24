-- Knowledge gaps (dwsearch.index.gaps; README, "Knowledge gaps"): for an org that opted in
-- (its org flag digital_worker_knowledge_gaps), each agent-context message or knowledge
-- query whose best knowledge article scored under DWSEARCH_KNOWLEDGE_GAP_THRESHOLD.
-- Only redacted text is stored. Rows go with the org's retention (SweepService.Purge
-- deletes those recorded before its cutoff) and with IndexService.ForgetKnowledgeGaps.
CREATE TABLE dw_knowledge_gaps (
    id            uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- The Index's org: the app id the agent context or the knowledge query was for.
    org_id        varchar     NOT NULL,
    -- The question, PII-redacted as index writes are (dwsearch.redaction, known names).
    query         text        NOT NULL,
    -- The dense similarity of the nearest knowledge article; NULL when the app had none.
    best_score    real,
    -- The nearest knowledge articles' ids, best first.
    candidate_ids varchar[]   NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Listing (an org's most recent gaps) and Purge (an org's gaps before a cutoff).
CREATE INDEX dw_knowledge_gaps_org_time_idx ON dw_knowledge_gaps (org_id, created_at);
