"""bge-m3: dense and sparse vectors from one forward pass of XLM-RoBERTa.

Computed exactly as FlagEmbedding's BGEM3FlagModel does (FlagEmbedding 1.4.2,
inference/embedder/encoder_only/m3.py and finetune/.../m3/modeling.py):
- dense: the last hidden state of the CLS token, L2-normalized in the model's dtype;
- sparse: relu(sparse_linear(last hidden state)) per token, the maximum per token id,
  keeping weights > 0 and dropping the tokenizer's cls, eos, pad and unk tokens;
- weights in float16 on a GPU and float32 on CPU; inputs cut to the limit keep their
  special tokens (the tokenizer's own truncation).
A checkpoint without `sparse_linear.pt` serves dense vectors only.

With the ONNX runtime (dwsearch.modelserver.onnxload) one graph gives both from one run: the CLS
hidden state and relu(sparse_linear(hidden)) per token; normalization and the lexical
weights are computed from them in numpy as below.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

SPARSE_HEAD = "sparse_linear.pt"
# Tokens whose lexical weight FlagEmbedding discards.
UNUSED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")
# Tokenizers without a limit report a huge sentinel model_max_length.
_NO_LIMIT = 1_000_000
# The int8 check's probes: cut as a service's default limit would not (bge-m3 takes 8192),
# in batches as the sweep sends them.
PROBE_MAX_TOKENS = 512
PROBE_BATCH = 8


class BgeM3Backend(HubModel, EmbeddingBackend):
    name = "bge-m3"
    service = "embedder"

    def load(self) -> BackendInfo:
        opened = self._open()
        resolved, device, choice = opened.resolved, opened.device, opened.choice
        from transformers import AutoConfig

        report = None
        try:
            tokenizer = load_tokenizer(resolved.path)
            if choice.runtime == "onnx":
                config = AutoConfig.from_pretrained(resolved.path, local_files_only=True)
                onnx, report = self._load_onnx(opened)
                has_sparse = "sparse_weights" in onnx.output_names
                dtype_label = onnxload.dtype_label(report.quantization)
            else:
                model, sparse_linear = _load_torch(resolved.path, resolve_dtype(self._dtype_setting, device))
                config = model.config
                self._model = model.to(device).eval()
                self._sparse_linear = sparse_linear.to(device) if sparse_linear is not None else None
                has_sparse = sparse_linear is not None
                dtype_label = dtype_name(next(model.parameters()).dtype)
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot load {resolved.path}: {exc}") from None
        self._use_tokenizer(tokenizer)
        # XLM-R positions start after the padding index, so two positions are not usable.
        limit = config.max_position_embeddings - config.pad_token_id - 1
        if tokenizer.model_max_length < _NO_LIMIT:
            limit = min(limit, tokenizer.model_max_length)
        return BackendInfo(
            **opened.described(dtype_label, report),
            backend=self.name,
            dimension=config.hidden_size,
            max_input_tokens=limit,
            sparse_supported=has_sparse,
            sparse_dimension=len(tokenizer) if has_sparse else 0,
        )

    @classmethod
    def export_spec(cls, path: Path) -> onnxexport.ExportSpec:
        """What `dwsearch export-onnx` traces: (input_ids, attention_mask) → dense (the CLS
        hidden state) and, with a sparse head, sparse_weights."""

        def build() -> onnxexport.ExportGraph:
            import torch

            tokenizer = load_tokenizer(path)
            model, sparse_linear = _load_torch(path, torch.float32)
            sample = tokenizer(["a padded example batch", "for tracing"], return_attention_mask=False)[
                "input_ids"
            ]
            input_ids, mask = onnxsession.pad_ids(sample, tokenizer.pad_token_id)
            inputs = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
            return onnxexport.ExportGraph(_graph(model.eval(), sparse_linear), inputs)

        def probe(graph: onnxsession.OnnxModel) -> EmbeddingProbes:
            backend = cls(str(path))
            backend._use_tokenizer(load_tokenizer(path))
            backend._onnx = graph
            sparse = "sparse_weights" in graph.output_names
            texts = probeset.guard_texts()
            encoded: list[Encoded] = []
            for start in range(0, len(texts), PROBE_BATCH):
                batch = backend.prepare(
                    texts[start : start + PROBE_BATCH], InputType.DOCUMENT, PROBE_MAX_TOKENS
                )
                encoded += backend.encode(batch, sparse=[sparse] * len(batch), normalize=[True] * len(batch))
            weights = [item.sparse or {} for item in encoded] if sparse else None
            return embedding_probes(np.stack([item.dense for item in encoded]), weights)

        outputs = {"dense": {0: "batch"}}
        if (path / SPARSE_HEAD).is_file():
            outputs["sparse_weights"] = {0: "batch", 1: "sequence"}
        return onnxexport.ExportSpec("embedder", cls.name, build, outputs, probe)

    def _use_tokenizer(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._pad_id = tokenizer.pad_token_id
        self._unused = np.array(
            sorted(
                tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[key])
                for key in UNUSED_TOKENS
                if key in tokenizer.special_tokens_map
            ),
            dtype=np.int64,
        )

    def count(self, texts: Sequence[str], input_type: InputType) -> list[int]:
        return [len(ids) for ids in self._tokenize(texts)]

    def tokenize(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        return hf_tokens(self._tokenizer, texts, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
        return hf_decode(self._tokenizer, ids, skip_special_tokens=skip_special_tokens)

    def prepare(self, texts: Sequence[str], input_type: InputType, max_tokens: int) -> list[PreparedInput]:
        prepared = []
        for text, ids in zip(texts, self._tokenize(texts), strict=True):
            if len(ids) > max_tokens:
                cut = self._tokenizer(text, truncation=True, max_length=max_tokens)["input_ids"]
                prepared.append(PreparedInput(len(ids), len(cut), cut))
            else:
                prepared.append(PreparedInput(len(ids), len(ids), ids))
        return prepared

    def _tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        # verbose=False: an over-long input is reported to the caller, not logged.
        ids: list[list[int]] = self._tokenizer(
            list(texts), truncation=False, return_attention_mask=False, verbose=False
        )["input_ids"]
        return ids

    def encode(
        self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
    ) -> list[Encoded]:
        if self._onnx is not None:
            return self._encode_onnx(inputs, sparse=sparse, normalize=normalize)
        import torch
        import torch.nn.functional as F

        ids = [item.payload for item in inputs]
        input_ids, attention_mask = pad_batch(ids, self._pad_id, self._device)
        with torch.inference_mode():
            hidden = self._model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            cls = hidden[:, 0]
            if any(normalize):
                wanted = torch.tensor(normalize, device=cls.device).unsqueeze(-1)
                cls = torch.where(wanted, F.normalize(cls, dim=-1), cls)
            dense = cls.float().cpu().numpy()
            weights = None
            if any(sparse) and self._sparse_linear is not None:
                weights = torch.relu(self._sparse_linear(hidden)).squeeze(-1).float().cpu().numpy()
        return [
            Encoded(
                dense=dense[row],
                sparse=self._lexical_weights(ids[row], weights[row])
                if weights is not None and sparse[row]
                else None,
            )
            for row in range(len(inputs))
        ]

    def _encode_onnx(
        self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
    ) -> list[Encoded]:
        assert self._onnx is not None
        ids = [item.payload for item in inputs]
        input_ids, attention_mask = onnxsession.pad_ids(ids, self._pad_id)
        outputs = self._onnx.run({"input_ids": input_ids, "attention_mask": attention_mask})
        dense = onnxsession.l2_normalize_rows(outputs["dense"], normalize)
        weights = outputs.get("sparse_weights") if any(sparse) else None
        return [
            Encoded(
                dense=dense[row],
                sparse=self._lexical_weights(ids[row], weights[row])
                if weights is not None and sparse[row]
                else None,
            )
            for row in range(len(inputs))
        ]

    def _lexical_weights(self, ids: Sequence[int], weights: np.ndarray) -> dict[int, float]:
        token_ids = np.asarray(ids, dtype=np.int64)
        token_weights = weights[: len(token_ids)]
        keep = (token_weights > 0) & ~np.isin(token_ids, self._unused)
        unique, where = np.unique(token_ids[keep], return_inverse=True)
        best = np.zeros(len(unique), dtype=np.float32)
        np.maximum.at(best, where, token_weights[keep])
        return dict(zip(unique.tolist(), best.tolist(), strict=True))


def _load_torch(path: Path, dtype: torch.dtype) -> tuple[Any, torch.nn.Linear | None]:
    """The XLM-R encoder (without its pooler: CLS pooling reads the last hidden state) and
    the sparse head when the checkpoint has one, on CPU."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, dtype=dtype, add_pooling_layer=False, local_files_only=True)
    sparse_linear = None
    head = path / SPARSE_HEAD
    if head.is_file():
        sparse_linear = torch.nn.Linear(model.config.hidden_size, 1, dtype=dtype)
        sparse_linear.load_state_dict(torch.load(head, map_location="cpu", weights_only=True))
        sparse_linear.eval()
    return model, sparse_linear


def _graph(model: torch.nn.Module, sparse_linear: torch.nn.Linear | None) -> torch.nn.Module:
    """The exported module: (input_ids, attention_mask) → CLS hidden state [B, H] and,
    with a sparse head, relu(sparse_linear(hidden)) [B, T]."""
    import torch

    class DenseSparse(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.sparse_linear = sparse_linear

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor
        ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            hidden: torch.Tensor = self.model(
                input_ids=input_ids, attention_mask=attention_mask
            ).last_hidden_state
            if self.sparse_linear is None:
                return hidden[:, 0]
            return hidden[:, 0], torch.relu(self.sparse_linear(hidden)).squeeze(-1)

    return DenseSparse().eval()
