"""A cross-encoder (a sequence-classification model with one logit, e.g.
bge-reranker-v2-m3) scored the way FlagEmbedding's FlagReranker scores it (FlagEmbedding
1.4.2, inference/reranker/encoder_only/base.py): the query is cut to 3/4 of max_length
and the document to max_length, each without special tokens, then the pair is joined
with the tokenizer's special tokens and only the document is cut to max_length.

With the ONNX runtime (dwsearch.modelserver.onnxload) the exported graph gives the same logits
(with token_type_ids as an input when the tokenizer makes them)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dwsearch.common.errors import StartupError
from dwsearch.modelserver import onnxexport, onnxload, onnxsession, probeset
from dwsearch.modelserver.modelfiles import HubModel, dtype_name, load_tokenizer, pad_batch, resolve_dtype
from dwsearch.modelserver.quantcheck import RerankProbes
from dwsearch_reranker.backends.base import PreparedPair, RerankBackend, RerankerInfo

if TYPE_CHECKING:
    import torch


# The int8 check's pairs are cut as the service's default max_length cuts them.
PROBE_MAX_LENGTH = 512


class CrossEncoderBackend(HubModel, RerankBackend):
    name = "cross-encoder"
    service = "reranker"

    def __init__(self, spec: str, *, max_length: int = 512, **settings: Any) -> None:
        """`settings`: HubModel's (model_id, device, dtype, threads, runtime, quantize,
        onnx_cache_dir)."""
        super().__init__(spec, **settings)
        self._max_length = max_length

    def load(self) -> RerankerInfo:
        from transformers import AutoConfig

        opened = self._open()
        resolved, device, choice = opened.resolved, opened.device, opened.choice
        try:
            tokenizer = load_tokenizer(resolved.path)
            config = AutoConfig.from_pretrained(resolved.path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot load {resolved.path}: {exc}") from None
        if config.num_labels != 1:
            raise StartupError(f"{resolved.path} has {config.num_labels} labels; a reranker has one logit")
        if self._max_length > tokenizer.model_max_length:
            raise StartupError(
                f"max length {self._max_length} is over {resolved.model_id}'s limit of {tokenizer.model_max_length}"
            )
        report = None
        if choice.runtime == "onnx":
            _, report = self._load_onnx(opened)
            dtype_label = onnxload.dtype_label(report.quantization)
        else:
            dtype = resolve_dtype(self._dtype_setting, device)
            self._model = _load_torch(resolved.path, dtype).to(device).eval()
            dtype_label = dtype_name(dtype)
        self._tokenizer = tokenizer
        return RerankerInfo(
            **opened.described(dtype_label, report),
            max_length=self._max_length,
        )

    @classmethod
    def export_spec(cls, path: Path) -> onnxexport.ExportSpec:
        """What `dwsearch export-onnx` traces: (input_ids, attention_mask[, token_type_ids])
        → logits [B, 1]."""

        def build() -> onnxexport.ExportGraph:
            import torch

            tokenizer = load_tokenizer(path)

            model = _load_torch(path, torch.float32).eval()
            encoded = tokenizer(
                ["a query", "another query"], ["a padded example batch", "for tracing"], padding=True,
                return_tensors="pt",
            )  # fmt: skip
            names = ["input_ids", "attention_mask"]
            if "token_type_ids" in encoded:  # BERT-style models tell the query from the document
                names.append("token_type_ids")
            return onnxexport.ExportGraph(_graph(model, names), {name: encoded[name] for name in names})

        def probe(graph: onnxsession.OnnxModel) -> RerankProbes:
            backend = cls(str(path), max_length=PROBE_MAX_LENGTH)
            backend._tokenizer = load_tokenizer(path)
            backend._onnx = graph
            return RerankProbes(
                [backend.score(backend.prepare(p.query, p.documents)) for p in probeset.RERANK_PROBES]
            )

        return onnxexport.ExportSpec("reranker", cls.name, build, {"logits": {0: "batch"}}, probe)

    def prepare(self, query: str, documents: Sequence[str]) -> list[PreparedPair]:
        tokenizer = self._tokenizer
        query_ids = tokenizer(
            query, add_special_tokens=False, truncation=True, max_length=self._max_length * 3 // 4
        )["input_ids"]
        document_ids = tokenizer(
            list(documents), add_special_tokens=False, truncation=True, max_length=self._max_length
        )["input_ids"]
        pairs = []
        for ids in document_ids:
            pair = tokenizer.prepare_for_model(
                query_ids,
                ids,
                truncation="only_second",
                max_length=self._max_length,
                return_attention_mask=False,
            )
            pairs.append(
                PreparedPair(len(pair["input_ids"]), (pair["input_ids"], pair.get("token_type_ids")))
            )
        return pairs

    def score(self, pairs: Sequence[PreparedPair]) -> np.ndarray:
        if self._onnx is not None:
            input_ids, attention_mask = onnxsession.pad_ids(
                [p.payload[0] for p in pairs], self._tokenizer.pad_token_id
            )
            feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
            if "token_type_ids" in self._onnx.input_names:
                feeds["token_type_ids"], _ = onnxsession.pad_ids([p.payload[1] for p in pairs], 0)
            return self._onnx.run(feeds)["logits"].reshape(-1).astype(np.float32, copy=False)
        import torch

        ids, mask = pad_batch([p.payload[0] for p in pairs], self._tokenizer.pad_token_id, self._device)
        tensors = {"input_ids": ids, "attention_mask": mask}
        if pairs[0].payload[1] is not None:  # BERT-style models tell the query from the document
            tensors["token_type_ids"], _ = pad_batch([p.payload[1] for p in pairs], 0, self._device)
        with torch.inference_mode():
            logits: torch.Tensor = self._model(**tensors).logits.view(-1)
        scores: np.ndarray = logits.float().cpu().numpy()
        return scores


def _load_torch(path: Path, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForSequenceClassification

    try:
        return AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot load {path}: {exc}") from None


def _graph(model: torch.nn.Module, names: list[str]) -> torch.nn.Module:
    """The exported module: (input_ids, attention_mask[, token_type_ids]) → logits [B, 1]."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor | None = None,
        ) -> torch.Tensor:
            extra = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            logits: torch.Tensor = self.model(
                input_ids=input_ids, attention_mask=attention_mask, **extra
            ).logits
            return logits

    return Logits().eval()
