"""SweepService (seed 003): one periodic watermark sweep embeds closed conversation
windows of Digital Worker chat history into dw_message_embeddings.

- window     windowing, closed vs open, chunk text (pure)
- substance  the window-level substance filter (pure)
- keyplan    one key's plan: where to start, late inserts, what each window replaces (pure)
- store      SQL: events, watermarks, finished windows and their ledger, retention
- embedqueue the sweep's windows merged into Embed calls
- sweeper    the sweep itself: model check, flags, key locks, batching, failures, budget
- service    the gRPC servicer
- cli        `dwsearch sweep` and `dwsearch purge`
"""
