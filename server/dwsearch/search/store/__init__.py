"""SQL of chat search, parameterized throughout; every statement filters by org, KNN also by
the active model. Optional filters are fixed fragments chosen by which parameters are
present, never text from the request.

- scope          ChatScope (the org, provider, channel and time every statement is limited
                 to), the window columns, a conversation's windows
- fulltext       full text over dw_chat_events: matches, matches with their windows, the
                 plan's statistics, an org's recent words
- knn            dense and sparse KNN, the opt-in HNSW index, an org's own HNSW index
- conversations  messages around hits; Similar's windows, messages and anchors
"""
