"""RerankerService: bge-reranker-v2-m3 cross-encoder scores."""
