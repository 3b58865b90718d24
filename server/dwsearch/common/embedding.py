"""One embedded input, as the embedder's engine produces it and the EmbedderService's
clients receive it (the wire form is dwsearch.v1.Embedding)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Embedding:
    dense: np.ndarray | None  # float32, shape (dimension,); None when not asked for
    sparse: dict[int, float] | None  # token id → lexical weight; None when not asked for
    token_count: int  # tokens the model saw
    truncated: bool  # the input was cut to the model's limit
