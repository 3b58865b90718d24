"""The contract between the reranker engine and a model backend. Threads as for the
embedder's backends: `prepare` runs only on the tokenizer thread, `score` only on the
inference thread."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dwsearch.modelserver.quantcheck import RuntimeReport, default_report


@dataclass(frozen=True)
class RerankerInfo:
    model_id: str
    revision: str
    max_length: int
    device: str
    dtype: str  # "int8" for a quantized ONNX model
    runtime: str  # "torch" | "onnx"
    runtime_report: RuntimeReport = field(default_factory=default_report)


@dataclass(frozen=True)
class PreparedPair:
    """A (query, document) pair tokenized for the model, within max_length."""

    length: int
    payload: Any


class RerankBackend(ABC):
    @abstractmethod
    def load(self) -> RerankerInfo:
        """Load the model (blocking) and describe it."""

    @abstractmethod
    def prepare(self, query: str, documents: Sequence[str]) -> list[PreparedPair]:
        """One pair per document, in order."""

    @abstractmethod
    def score(self, pairs: Sequence[PreparedPair]) -> np.ndarray:
        """Raw relevance logits, one per pair (float32)."""
