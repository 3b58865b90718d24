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
