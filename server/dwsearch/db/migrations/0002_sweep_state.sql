-- Sweep state (seed 003): a watermark per (org, provider, channel, model), every
-- finished window with the events it covers, and each org's retention cutoff.

-- The position of the last event of the key's last finished window, in the sweep's
-- event order (created_at, id). NULL position: nothing finished yet (the backfill).
CREATE TABLE dw_sweep_watermarks (
    org_id               varchar     NOT NULL,
    provider             varchar     NOT NULL,
    external_channel_id  varchar     NOT NULL,
    model                varchar     NOT NULL,
    last_event_time      timestamptz,
    last_event_id        uuid,
    -- Sweeps in a row that failed on the key's next window; reset when it advances.
    consecutive_failures integer     NOT NULL DEFAULT 0,
    last_error           text,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, provider, external_channel_id, model),
    CHECK ((last_event_time IS NULL) = (last_event_id IS NULL))
);

-- Every finished window: embedded (its dw_message_embeddings row has the same id),
-- skipped by the substance filter, or poison (failed permanently or too often; kept with
-- its error until RetryPoison releases it).
CREATE TABLE dw_sweep_windows (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id              varchar     NOT NULL,
    provider            varchar     NOT NULL,
    external_channel_id varchar     NOT NULL,
    model               varchar     NOT NULL,
    status              varchar     NOT NULL CHECK (status IN ('embedded', 'skipped', 'poison')),
    window_start        timestamptz NOT NULL,
    window_end          timestamptz NOT NULL,
    source_message_ids  uuid[]      NOT NULL,
    error               text,
    attempts            integer     NOT NULL DEFAULT 0,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dw_sweep_windows_org_start_idx ON dw_sweep_windows (org_id, window_start);
CREATE INDEX dw_sweep_windows_poison_idx ON dw_sweep_windows (org_id) WHERE status = 'poison';

-- The ledger: which finished window covers each event, per model. The primary key is
-- the guarantee that no event is in two windows of one model, so no window is ever
-- embedded twice, even by concurrent sweepers; an eligible event at or before its
-- key's watermark without a row here was inserted late and is swept again.
CREATE TABLE dw_sweep_window_events (
    model     varchar NOT NULL,
    event_id  uuid    NOT NULL,
    window_id uuid    NOT NULL REFERENCES dw_sweep_windows (id) ON DELETE CASCADE,
    PRIMARY KEY (model, event_id)
);
CREATE INDEX dw_sweep_window_events_window_idx ON dw_sweep_window_events (window_id);

-- The latest retention cutoff Purge applied per org: sweeps never embed older events.
CREATE TABLE dw_sweep_retention (
    org_id     varchar PRIMARY KEY,
    cutoff     timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Purge deletes by (org, window start).
CREATE INDEX dw_message_embeddings_org_start_idx ON dw_message_embeddings (org_id, window_start);
