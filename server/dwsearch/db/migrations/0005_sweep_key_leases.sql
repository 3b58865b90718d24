-- Sweep key locks as leases, for DWSEARCH_DB_TRANSACTION_POOLING (pgbouncer in
-- transaction mode), where a session advisory lock would stay on whichever server
-- connection took it. A sweeper holds a key while its row is unexpired; it deletes the
-- row when done, and a crashed sweeper's row expires.
CREATE TABLE dw_sweep_key_leases (
    org_id              varchar     NOT NULL,
    provider            varchar     NOT NULL,
    external_channel_id varchar     NOT NULL,
    model               varchar     NOT NULL,
    holder              text        NOT NULL,
    expires_at          timestamptz NOT NULL,
    PRIMARY KEY (org_id, provider, external_channel_id, model)
);
