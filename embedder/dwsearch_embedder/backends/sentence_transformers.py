"""Any sentence-transformers model, dense only (e.g. all-MiniLM-L6-v2).

The model's own tokenizer and prompts prepare the inputs ("query" / "document" prompts
where the model defines them), and its module pipeline (transformer, pooling, optional
normalization) runs on the pre-tokenized batch, so the vectors equal
`SentenceTransformer.encode`'s.

With the ONNX runtime (dwsearch.modelserver.onnxload) the whole pipeline is one graph giving the
sentence embedding; the export keeps a copy of the model's tokenizer and records its
prompts, dimension and sequence limit, so a cached export loads without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dwsearch.common.errors import StartupError
from dwsearch.modelserver import onnxexport, onnxload, onnxsession, probeset
from dwsearch.modelserver.modelfiles import HubModel, dtype_name, load_tokenizer, pad_batch, resolve_dtype
from dwsearch.modelserver.quantcheck import EmbeddingProbes, embedding_probes
from dwsearch_embedder.backends.base import (
    BackendInfo,
    EmbeddingBackend,
    Encoded,
    InputType,
    PreparedInput,
    Token,
    hf_decode,
    hf_tokens,
)

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer


# The int8 check's probes go in batches as the sweep sends them.
PROBE_BATCH = 8


class SentenceTransformersBackend(HubModel, EmbeddingBackend):
    name = "sentence-transformers"
    service = "embedder"

    def load(self) -> BackendInfo:
        opened = self._open()
        resolved, device, choice = opened.resolved, opened.device, opened.choice
        report = None
        if choice.runtime == "onnx":
            onnx, report = self._load_onnx(opened)
            manifest = onnx.manifest
            try:
                self._tokenizer = load_tokenizer(onnx.directory)
            except (OSError, ValueError) as exc:
                raise StartupError(f"cannot load the tokenizer of {onnx.directory}: {exc}") from None
            prompts, dimension, max_seq_length = (
                manifest["prompts"],
                manifest["dimension"],
                manifest["max_seq_length"],
            )
            dtype_label = onnxload.dtype_label(report.quantization)
        else:
            model = _load_sentence_transformer(resolved.path, device)
            dtype = resolve_dtype(self._dtype_setting, device)
            self._model = model.to(dtype).eval()
            self._tokenizer = model.tokenizer
            prompts, dimension, max_seq_length = _describe(model)
            dtype_label = dtype_name(dtype)
        self._use_prompts(prompts)
        return BackendInfo(
            **opened.described(dtype_label, report),
            backend=self.name,
            dimension=dimension,
            max_input_tokens=max_seq_length,
            sparse_supported=False,
            sparse_dimension=0,
        )

    @classmethod
    def export_spec(cls, path: Path) -> onnxexport.ExportSpec:
        """What `dwsearch export-onnx` traces: (input_ids, attention_mask) → the sentence
        embedding; the manifest records prompts, dimension and limit, the tokenizer is copied."""

        def build() -> onnxexport.ExportGraph:
            import torch

            model = _load_sentence_transformer(path, "cpu").float().eval()
            prompts, dimension, max_seq_length = _describe(model)
            tokenizer = model.tokenizer
            sample = tokenizer(["a padded example batch", "for tracing"], return_attention_mask=False)[
                "input_ids"
            ]
            input_ids, mask = onnxsession.pad_ids(sample, tokenizer.pad_token_id)
            inputs = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
            extras = {"prompts": prompts, "dimension": dimension, "max_seq_length": max_seq_length}
            return onnxexport.ExportGraph(_graph(model), inputs, extras, tokenizer)

        def probe(graph: onnxsession.OnnxModel) -> EmbeddingProbes:
            backend = cls(str(path))
            backend._tokenizer = load_tokenizer(path)
            backend._use_prompts(graph.manifest["prompts"])
            backend._onnx = graph
            limit = graph.manifest["max_seq_length"]
            vectors: list[np.ndarray] = []
            for input_type, texts in (
                (InputType.DOCUMENT, probeset.guard_texts()),
                (InputType.QUERY, list(probeset.QUERIES)),
            ):
                for start in range(0, len(texts), PROBE_BATCH):
                    batch = backend.prepare(texts[start : start + PROBE_BATCH], input_type, limit)
                    encoded = backend.encode(
                        batch, sparse=[False] * len(batch), normalize=[True] * len(batch)
                    )
                    vectors += [item.dense for item in encoded]
            return embedding_probes(np.stack(vectors))

        return onnxexport.ExportSpec("embedder", cls.name, build, {"sentence_embedding": {0: "batch"}}, probe)

    def _use_prompts(self, prompts: dict[str, str]) -> None:
        self._prompts = {
            InputType.QUERY: prompts.get("query", ""),
            InputType.DOCUMENT: prompts.get("document") or prompts.get("passage", ""),
        }

    def count(self, texts: Sequence[str], input_type: InputType) -> list[int]:
        return [len(ids) for ids in self._tokenize(texts, input_type)]

    def tokenize(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        return hf_tokens(self._tokenizer, texts, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
        return hf_decode(self._tokenizer, ids, skip_special_tokens=skip_special_tokens)

    def prepare(self, texts: Sequence[str], input_type: InputType, max_tokens: int) -> list[PreparedInput]:
        prompt = self._prompts[input_type]
        prepared = []
        for text, ids in zip(texts, self._tokenize(texts, input_type), strict=True):
            if len(ids) > max_tokens:
                cut = self._tokenizer(prompt + text, truncation=True, max_length=max_tokens)["input_ids"]
                prepared.append(PreparedInput(len(ids), len(cut), cut))
            else:
                prepared.append(PreparedInput(len(ids), len(ids), ids))
        return prepared

    def _tokenize(self, texts: Sequence[str], input_type: InputType) -> list[list[int]]:
        prompt = self._prompts[input_type]
        ids: list[list[int]] = self._tokenizer(
            [prompt + text for text in texts], truncation=False, return_attention_mask=False, verbose=False
        )["input_ids"]
        return ids

    def encode(
        self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
    ) -> list[Encoded]:
        if self._onnx is not None:
            input_ids, attention_mask = onnxsession.pad_ids(
                [item.payload for item in inputs], self._tokenizer.pad_token_id
            )
            outputs = self._onnx.run({"input_ids": input_ids, "attention_mask": attention_mask})
            vectors = onnxsession.l2_normalize_rows(outputs["sentence_embedding"], normalize)
            return [Encoded(dense=vectors[row], sparse=None) for row in range(len(inputs))]
        import torch
        import torch.nn.functional as F

        ids, mask = pad_batch([item.payload for item in inputs], self._tokenizer.pad_token_id, self._device)
        with torch.inference_mode():
            features = self._model({"input_ids": ids, "attention_mask": mask})
            dense = features["sentence_embedding"]
            if any(normalize):
                wanted = torch.tensor(normalize, device=dense.device).unsqueeze(-1)
                dense = torch.where(wanted, F.normalize(dense, dim=-1), dense)
            vectors = dense.float().cpu().numpy()
        return [Encoded(dense=vectors[row], sparse=None) for row in range(len(inputs))]


def _load_sentence_transformer(path: Path, device: str) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer

    try:
        model: SentenceTransformer = SentenceTransformer(str(path), device=device, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot load {path}: {exc}") from None
    if model.tokenizer is None or model.max_seq_length is None:
        raise StartupError(f"{path} is not a text embedding model")
    return model


def _describe(model: SentenceTransformer) -> tuple[dict[str, str], int, int]:
    """Prompts, dimension and sequence limit of a loaded SentenceTransformer."""
    prompts = {name: prompt or "" for name, prompt in model.prompts.items()}
    return prompts, int(model.get_embedding_dimension() or 0), int(model.max_seq_length or 0)


def _graph(model: SentenceTransformer) -> torch.nn.Module:
    """The exported module: (input_ids, attention_mask) → the model's sentence embedding
    (transformer, pooling and any normalization its pipeline has)."""
    import torch

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            embedding: torch.Tensor = self.model({"input_ids": input_ids, "attention_mask": attention_mask})[
                "sentence_embedding"
            ]
            return embedding

    return SentenceEmbedding().eval()
