"""`dwsearch reranker`: the RerankerService process."""

from __future__ import annotations

from dwsearch.common.config import RerankerConfig
from dwsearch.common.grpcserver import Service
from dwsearch.common.modelserver import serve_model
from dwsearch.reranker.backends import select_backend
from dwsearch.reranker.backends.base import RerankBackend
from dwsearch.reranker.engine import Reranker, RerankLimits
from dwsearch.reranker.service import SERVICE_NAME, RerankerServicer
from dwsearch.v1 import reranker_pb2_grpc as pb_grpc


def build_engine(cfg: RerankerConfig, backend: RerankBackend | None = None) -> Reranker:
    limits = RerankLimits(
        max_batch_tokens=cfg.max_batch_tokens,
        max_batch_inputs=cfg.max_batch_inputs,
        max_queue=cfg.max_queue,
        max_documents_per_request=cfg.max_documents_per_request,
        max_queue_tokens=cfg.max_queue_tokens,
        max_request_bytes=cfg.max_request_bytes,
        bulk_batch_ms=cfg.bulk_batch_ms,
    )
    backend = backend or select_backend(cfg)
    return Reranker(backend, limits)


async def run_reranker(cfg: RerankerConfig, backend: RerankBackend | None = None) -> None:
    """Serve until SIGTERM (see serve_model). `backend` replaces the configured one."""

    def service(engine: Reranker) -> Service:
        servicer = RerankerServicer(engine)
        return Service(
            SERVICE_NAME, lambda server: pb_grpc.add_RerankerServiceServicer_to_server(servicer, server)
        )

    await serve_model(cfg, lambda: build_engine(cfg, backend), service, process="reranker")
