-- When each org last had the sweep's full check (dwsearch.sweep.store.discovery): every
-- eligible event of the org against the ledger, for events inserted late at or before
-- their key's watermark, and the windows holding events since deleted, edited or made
-- ineligible. A sweep checks the orgs least recently checked first, within a time budget;
-- an org without a row was never checked, or asked to be checked again (Purge, Forget and
-- RetryPoison delete its row: they leave uncovered events behind the watermark).
CREATE TABLE dw_sweep_org_checks (
    org_id     varchar     PRIMARY KEY,
    checked_at timestamptz NOT NULL
);
CREATE INDEX dw_sweep_org_checks_checked_idx ON dw_sweep_org_checks (checked_at);
