-- The ledger carries its window's org (docs/scaling.md), as every other table of the sweep
-- does: each statement on it filters on org_id, so all of an org's sweep state lives in one
-- org_id hash partition (one Citus shard, co-located with dw_chat_events and the windows).
ALTER TABLE dw_sweep_window_events ADD COLUMN org_id varchar;

UPDATE dw_sweep_window_events AS l SET org_id = w.org_id
FROM dw_sweep_windows AS w
WHERE w.id = l.window_id;

ALTER TABLE dw_sweep_window_events ALTER COLUMN org_id SET NOT NULL;

-- The primary key stays the guarantee that no event is in two windows of one model. Event
-- ids (dw_chat_events.id, a uuid primary key) are unique across orgs, and an event belongs
-- to one org, so (org_id, model, event_id) is unique exactly when (model, event_id) is:
-- the same guarantee, in the form a table partitioned or distributed by org_id can enforce
-- (its unique constraints must include the partition column). org_id leads, as in the
-- sweep's other keys; every lookup names the org, the model and the event.
ALTER TABLE dw_sweep_window_events DROP CONSTRAINT dw_sweep_window_events_pkey;
ALTER TABLE dw_sweep_window_events ADD PRIMARY KEY (org_id, model, event_id);
