"""`dwsearch embedder`: the EmbedderService process."""

from __future__ import annotations

from dwsearch.common.config import EmbedderConfig
from dwsearch.common.grpcserver import Service
from dwsearch.common.modelserver import serve_model
from dwsearch.embedder.backends import select_backend
from dwsearch.embedder.backends.base import EmbeddingBackend
from dwsearch.embedder.engine import Embedder, EngineLimits
from dwsearch.embedder.service import SERVICE_NAME, EmbedderServicer
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc


def build_engine(cfg: EmbedderConfig, backend: EmbeddingBackend | None = None) -> Embedder:
    limits = EngineLimits(
        max_batch_tokens=cfg.max_batch_tokens,
        max_batch_inputs=cfg.max_batch_inputs,
        max_queue=cfg.max_queue,
        max_inputs_per_request=cfg.max_inputs_per_request,
        max_input_tokens=cfg.max_input_tokens,
        max_queue_tokens=cfg.max_queue_tokens,
        max_request_bytes=cfg.max_request_bytes,
        bulk_batch_ms=cfg.bulk_batch_ms,
    )
    return Embedder(backend or select_backend(cfg), limits)


async def run_embedder(cfg: EmbedderConfig, backend: EmbeddingBackend | None = None) -> None:
    """Serve until SIGTERM (see serve_model). `backend` replaces the configured one."""

    def service(engine: Embedder) -> Service:
        servicer = EmbedderServicer(engine)
        return Service(
            SERVICE_NAME, lambda server: pb_grpc.add_EmbedderServiceServicer_to_server(servicer, server)
        )

    await serve_model(cfg, lambda: build_engine(cfg, backend), service, process="embedder")
