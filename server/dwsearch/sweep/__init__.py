"""SweepService (docs/design.md, "Sweep"): one periodic watermark sweep embeds closed
conversation windows of Digital Worker chat history into dw_message_embeddings, for each
configured model (DWSEARCH_EMBED_MODELS).

- window     windowing, closed vs open, chunk text (pure)
- substance  the window-level substance filter (pure)
- keyplan    one key's plan: where to start, late inserts, what each window replaces (pure)
- store      SQL, split into keys (backlog, events, key locks), writes, status and retention
- embedqueue the sweep's windows merged into Embed calls
- keyrun     one key swept for one model: batches, commits, failures and poison; returns what it did
- sweeper    the sweep itself: stale windows, models, flags, key locks, concurrency, budget, progress
- admin      Status, Purge, Forget, RetryPoison
- service    the gRPC servicer
- commands   the client commands: `dwsearch sweep`, `purge`, `forget`, `sweep-status`, `retry-poison`
"""
