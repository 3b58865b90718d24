"""A cross-encoder (a sequence-classification model with one logit, e.g.
bge-reranker-v2-m3) scored the way FlagEmbedding's FlagReranker scores it (FlagEmbedding
1.4.2, inference/reranker/encoder_only/base.py): the query is cut to 3/4 of max_length
and the document to max_length, each without special tokens, then the pair is joined
with the tokenizer's special tokens and only the document is cut to max_length."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dwsearch.embedder.runtime import (
    StartupError,
    dtype_name,
    pad_batch,
    resolve_device,
    resolve_dtype,
    resolve_model,
)
from dwsearch.reranker.backends.base import PreparedPair, RerankBackend, RerankerInfo


class CrossEncoderBackend(RerankBackend):
    def __init__(
        self, spec: str, *, model_id: str = "", max_length: int = 512, device: str = "auto", dtype: str = "auto"
    ) -> None:
        self._spec = spec
        self._model_id = model_id
        self._max_length = max_length
        self._device_setting = device
        self._dtype_setting = dtype

    def load(self) -> RerankerInfo:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        resolved = resolve_model(self._spec, self._model_id)
        device = resolve_device(self._device_setting)
        dtype = resolve_dtype(self._dtype_setting, device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(resolved.path, local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(
                resolved.path, dtype=dtype, local_files_only=True
            )
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot load {resolved.path}: {exc}") from None
        if model.config.num_labels != 1:
            raise StartupError(f"{resolved.path} has {model.config.num_labels} labels; a reranker has one logit")
        if self._max_length > tokenizer.model_max_length:
            raise StartupError(
                f"max length {self._max_length} is over {resolved.model_id}'s limit of {tokenizer.model_max_length}"
            )
        self._tokenizer = tokenizer
        self._model = model.to(device).eval()
        self._device = device
        return RerankerInfo(
            model_id=resolved.model_id,
            revision=resolved.revision,
            max_length=self._max_length,
            device=device,
            dtype=dtype_name(dtype),
        )

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
                query_ids, ids, truncation="only_second", max_length=self._max_length, return_attention_mask=False
            )
            pairs.append(PreparedPair(len(pair["input_ids"]), (pair["input_ids"], pair.get("token_type_ids"))))
        return pairs

    def score(self, pairs: Sequence[PreparedPair]) -> np.ndarray:
        import torch

        input_ids, attention_mask = pad_batch([p.payload[0] for p in pairs], self._tokenizer.pad_token_id, self._device)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if pairs[0].payload[1] is not None:  # BERT-style models tell the query from the document
            inputs["token_type_ids"], _ = pad_batch([p.payload[1] for p in pairs], 0, self._device)
        with torch.inference_mode():
            logits = self._model(**inputs).logits.view(-1)
        return logits.float().cpu().numpy()
