"""A tiny cross-encoder with the real XLM-R tokenizer, loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_servers import LoadedRerank

from dwsearch_reranker.backends.cross_encoder import CrossEncoderBackend
from dwsearch_testkit.tiny_models import build_tiny_cross_encoder


@pytest.fixture(scope="session")
def tiny_cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-reranker"))


@pytest.fixture(scope="session")
def tiny_reranker(tiny_cross_encoder_dir: Path) -> LoadedRerank:
    return LoadedRerank(CrossEncoderBackend(str(tiny_cross_encoder_dir), device="cpu"))
