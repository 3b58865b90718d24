-- Tables owned by the Go digitalworker module, created by `dwsearch migrate --dev-schema`
-- for development and tests only. In production the Go module's migrations own them;
-- `dwsearch serve` only checks that the columns it reads exist.
CREATE TABLE IF NOT EXISTS dw_chat_events (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id              varchar     NOT NULL,
    provider            varchar     NOT NULL,
    external_channel_id varchar     NOT NULL,
    event_type          varchar     NOT NULL,
    decision            varchar     NOT NULL,
    message_text        text        NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL DEFAULT now(),
    search_tsv          tsvector GENERATED ALWAYS AS (to_tsvector('simple', message_text)) STORED
);
CREATE INDEX IF NOT EXISTS dw_chat_events_search_tsv_idx ON dw_chat_events USING gin (search_tsv);
CREATE INDEX IF NOT EXISTS dw_chat_events_scope_idx
    ON dw_chat_events (org_id, provider, external_channel_id, created_at, id);

CREATE TABLE IF NOT EXISTS admin_feature_flags (
    flag_key   varchar PRIMARY KEY,
    enabled    boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- Semantic search ships dark: the admin tier is seeded OFF.
INSERT INTO admin_feature_flags (flag_key, enabled) VALUES ('digital_worker_semantic_search', false)
    ON CONFLICT (flag_key) DO NOTHING;

CREATE TABLE IF NOT EXISTS org_feature_flags (
    org_id     varchar     NOT NULL,
    flag_key   varchar     NOT NULL,
    enabled    boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, flag_key)
);

-- On Citus (docs/scaling.md, "Past one node": the SQL the Go module's migration runs):
-- dw_chat_events distributed by org_id, keyed by (org_id, id), in the co-location group of
-- dwsearch's org tables; the flags replicated to every node as reference tables.
DO $citus$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;  -- plain Postgres (pg_dist_partition exists only with Citus: checked apart)
    END IF;
    IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'dw_chat_events'::regclass) THEN
        RETURN;  -- distributed already
    END IF;
    SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
    ALTER TABLE dw_chat_events DROP CONSTRAINT dw_chat_events_pkey, ADD PRIMARY KEY (org_id, id);
    PERFORM create_distributed_table('dw_chat_events', 'org_id', colocate_with => 'dw_sweep_windows');
    PERFORM create_reference_table('admin_feature_flags');
    PERFORM create_reference_table('org_feature_flags');
END
$citus$;
