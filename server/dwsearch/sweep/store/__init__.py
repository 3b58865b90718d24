"""SQL of the sweep, parameterized throughout: reads of the Go-owned dw_chat_events, and
the sweep state tables (migration 0002) plus the dw_message_embeddings rows it writes.

- keys       a sweep's reads of its keys (backlog, watermark, events) and the key locks
- writes     finished windows, watermark advances, failures, poison released
- status     Status's reads: watermarks and lag, unswept keys, poison, counts
- retention  windows deleted with their events: Purge, Forget, stale windows
"""
