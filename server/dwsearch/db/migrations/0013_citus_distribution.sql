-- On a database with the citus extension (docs/scaling.md, "Past one node"): dwsearch's
-- tables distributed, every org table by org_id in one co-location group (with the Go
-- module's dw_chat_events, distributed by the same column type), the support index by
-- namespace. Unique and foreign keys include the distribution column, as a distributed
-- table's must. On plain Postgres this changes nothing.
DO $citus$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    -- Shards are created and filled one after another inside this transaction.
    SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
    ALTER TABLE dw_sweep_window_events DROP CONSTRAINT dw_sweep_window_events_window_id_fkey;
    ALTER TABLE dw_sweep_windows DROP CONSTRAINT dw_sweep_windows_pkey, ADD PRIMARY KEY (org_id, id);
    ALTER TABLE dw_message_embeddings DROP CONSTRAINT dw_message_embeddings_pkey, ADD PRIMARY KEY (org_id, id);
    ALTER TABLE dw_knowledge_gaps DROP CONSTRAINT dw_knowledge_gaps_pkey, ADD PRIMARY KEY (org_id, id);

    PERFORM create_distributed_table('dw_sweep_windows', 'org_id', colocate_with => 'default');
    PERFORM create_distributed_table('dw_sweep_window_events', 'org_id', colocate_with => 'dw_sweep_windows');
    PERFORM create_distributed_table('dw_message_embeddings', 'org_id', colocate_with => 'dw_sweep_windows');
    PERFORM create_distributed_table('dw_sweep_watermarks', 'org_id', colocate_with => 'dw_sweep_windows');
    PERFORM create_distributed_table('dw_sweep_key_leases', 'org_id', colocate_with => 'dw_sweep_windows');
    PERFORM create_distributed_table('dw_sweep_retention', 'org_id', colocate_with => 'dw_sweep_windows');
    PERFORM create_distributed_table('dw_sweep_org_checks', 'org_id', colocate_with => 'dw_sweep_windows');
    PERFORM create_distributed_table('dw_knowledge_gaps', 'org_id', colocate_with => 'dw_sweep_windows');
    PERFORM create_distributed_table('dw_knn_indexes', 'org_id', colocate_with => 'dw_sweep_windows');
    ALTER TABLE dw_sweep_window_events
        ADD CONSTRAINT dw_sweep_window_events_window_fkey FOREIGN KEY (org_id, window_id)
        REFERENCES dw_sweep_windows (org_id, id) ON DELETE CASCADE;

    -- A group of their own: an Index query never joins an org table.
    PERFORM create_distributed_table('dw_index_documents', 'namespace', colocate_with => 'none');
    PERFORM create_distributed_table('dw_index_namespaces', 'namespace', colocate_with => 'dw_index_documents');
END
$citus$;
