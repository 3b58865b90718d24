"""`dwsearch embedder`: the EmbedderService process, serving one model or several
(DWSEARCH_EMBED_MODELS) on the shared model-server runtime (dwsearch.modelserver.runtime)."""

from __future__ import annotations

from dwsearch.common.config import EmbedderConfig
from dwsearch.common.errors import StartupError
from dwsearch.modelserver.runtime import grpc_service, limits_from, serve_model, shared_by_models
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_embedder.backends import select_backend
from dwsearch_embedder.backends.base import EmbeddingBackend
from dwsearch_embedder.engine import Embedder, EngineLimits
from dwsearch_embedder.http import EmbedderHttp
from dwsearch_embedder.service import SERVICE_NAME, EmbedderServicer


def engine_limits(cfg: EmbedderConfig) -> EngineLimits:
    return limits_from(
        cfg,
        EngineLimits,
        max_inputs_per_request=cfg.max_inputs_per_request,
        max_input_tokens=cfg.max_input_tokens,
    )


def build_engine(cfg: EmbedderConfig, backend: EmbeddingBackend | None = None) -> Embedder:
    """The engine of a single-model embedder (DWSEARCH_EMBED_MODEL, DWSEARCH_EMBED_BACKEND)."""
    return Embedder(backend or select_backend(cfg), engine_limits(cfg), name=cfg.models[0])


def build_engines(cfg: EmbedderConfig, backend: EmbeddingBackend | None = None) -> list[Embedder]:
    """One engine per served model, the default first. With one model, exactly the
    single-model engine. With several (DWSEARCH_EMBED_MODELS), each model's backend is
    the one `auto` picks for it, and the engines share one admission budget and one bulk
    lock (dwsearch.modelserver.runtime.Shared): each backend gets the process's whole thread
    count, and only one bulk batch runs at a time, so the models do not oversubscribe the
    cores while each one's queries still run beside the bulk batch."""
    models = cfg.models
    if len(models) == 1:
        return [build_engine(cfg, backend)]
    if backend is not None:
        raise StartupError("a backend given in code replaces a single model, not several")
    limits = engine_limits(cfg)
    shared = shared_by_models("embedder", limits)
    engines = []
    for model in models:
        try:
            engines.append(Embedder(select_backend(cfg, model=model), limits, name=model, shared=shared))
        except StartupError as exc:
            raise StartupError(f"model {model}: {exc}") from None
    return engines


async def run_embedder(cfg: EmbedderConfig, backend: EmbeddingBackend | None = None) -> None:
    """Serve until SIGTERM (see serve_model). `backend` replaces the configured one (a
    single model only)."""
    await serve_model(
        cfg,
        lambda: build_engines(cfg, backend),
        lambda engines: grpc_service(
            SERVICE_NAME, pb_grpc.add_EmbedderServiceServicer_to_server, EmbedderServicer(engines)
        ),
        process="embedder",
        make_http=lambda engines, state: EmbedderHttp(engines, state).app(),
    )
