"""The retrieval core chat search (dwsearch.search) and the Index (dwsearch.index) share:
what sits between a store's ranked legs and an answer, whatever the hit.

- pipeline     a call's legs run at once (the first failure stands for all), and a
               fused pool reranked or kept with the reason: legs -> fusion -> rerank
- fusion       the fusion methods (one enum) and their primitives: RRF, min-max, DBSF
- rerank       the reranker behind its breaker and deadline, and how it degrades
- stages       an explained call's stage times
- degradation  why an answer is less than asked for
- bm25         the BM25 sparse encoder (CJK bigrams, words elsewhere): a REST index's
               sparse_model = "BM25" and chat search's lexical leg
- chinese      Simplified and Traditional Chinese folded to one form (OpenCC's table):
               the lexical leg's terms and highlights
"""
