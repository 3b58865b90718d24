"""Any sentence-transformers model, dense only (e.g. all-MiniLM-L6-v2).

The model's own tokenizer and prompts prepare the inputs ("query" / "document" prompts
where the model defines them), and its module pipeline (transformer, pooling, optional
normalization) runs on the pre-tokenized batch, so the vectors equal
`SentenceTransformer.encode`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from dwsearch.embedder.backends.base import BackendInfo, EmbeddingBackend, Encoded, InputType, PreparedInput
from dwsearch.embedder.runtime import (
    StartupError,
    dtype_name,
    pad_batch,
    resolve_device,
    resolve_dtype,
    resolve_model,
)


class SentenceTransformersBackend(EmbeddingBackend):
    name = "sentence-transformers"

    def __init__(self, spec: str, *, model_id: str = "", device: str = "auto", dtype: str = "auto") -> None:
        self._spec = spec
        self._model_id = model_id
        self._device_setting = device
        self._dtype_setting = dtype

    def load(self) -> BackendInfo:
        from sentence_transformers import SentenceTransformer

        resolved = resolve_model(self._spec, self._model_id)
        device = resolve_device(self._device_setting)
        dtype = resolve_dtype(self._dtype_setting, device)
        try:
            model = SentenceTransformer(str(resolved.path), device=device, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot load {resolved.path}: {exc}") from None
        tokenizer = model.tokenizer
        if tokenizer is None or model.max_seq_length is None:
            raise StartupError(f"{resolved.path} is not a text embedding model")
        self._model = model.to(dtype).eval()
        self._tokenizer = tokenizer
        self._device = device
        self._prompts = {
            InputType.QUERY: model.prompts.get("query", ""),
            InputType.DOCUMENT: model.prompts.get("document") or model.prompts.get("passage", ""),
        }
        return BackendInfo(
            model_id=resolved.model_id,
            revision=resolved.revision,
            backend=self.name,
            dimension=int(model.get_embedding_dimension()),
            max_input_tokens=int(model.max_seq_length),
            sparse_supported=False,
            sparse_dimension=0,
            device=device,
            dtype=dtype_name(dtype),
        )

    def count(self, texts: Sequence[str], input_type: InputType) -> list[int]:
        return [len(ids) for ids in self._tokenize(texts, input_type)]

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
        return self._tokenizer(
            [prompt + text for text in texts], truncation=False, return_attention_mask=False, verbose=False
        )["input_ids"]

    def encode(
        self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
    ) -> list[Encoded]:
        import torch
        import torch.nn.functional as F

        input_ids, attention_mask = pad_batch(
            [item.payload for item in inputs], self._tokenizer.pad_token_id, self._device
        )
        with torch.inference_mode():
            features = self._model({"input_ids": input_ids, "attention_mask": attention_mask})
            dense = features["sentence_embedding"]
            if any(normalize):
                wanted = torch.tensor(normalize, device=dense.device).unsqueeze(-1)
                dense = torch.where(wanted, F.normalize(dense, dim=-1), dense)
            vectors = dense.float().cpu().numpy()
        return [Encoded(dense=vectors[row], sparse=None) for row in range(len(inputs))]
