-- The md5 of each event's message_text as its window used it. A sweep drops the windows
-- whose events were edited since (as it drops those of deleted events) and windows their
-- events again, so search never serves text the chat no longer has. NULL (rows written
-- before this migration): not compared.
ALTER TABLE dw_sweep_window_events ADD COLUMN text_md5 uuid;
