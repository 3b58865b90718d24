"""Model backends of the RerankerService, behind one small abstract base."""

from __future__ import annotations

from dwsearch.common.config import RerankerConfig
from dwsearch.modelserver.threads import resolve_threads
from dwsearch_reranker.backends.base import RerankBackend


def select_backend(cfg: RerankerConfig, threads: int | None = None) -> RerankBackend:
    """The cross-encoder for `cfg`, not yet loaded; `threads` (resolved, ≥ 1) defaults to
    `cfg.threads` resolved against the container's CPU quota."""
    from dwsearch_reranker.backends.cross_encoder import CrossEncoderBackend

    return CrossEncoderBackend(
        cfg.rerank_model,
        model_id=cfg.rerank_model_id,
        max_length=cfg.rerank_max_length,
        device=cfg.device,
        dtype=cfg.dtype,
        threads=threads or resolve_threads(cfg.threads),
        runtime=cfg.embed_runtime,
        quantize=cfg.quantize,
        onnx_cache_dir=cfg.onnx_cache_dir,
    )
