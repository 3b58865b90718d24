"""`dwsearch reranker`: the RerankerService process, on the shared model-server runtime
(dwsearch.modelserver.runtime)."""

from __future__ import annotations

from dwsearch.common.config import RerankerConfig
from dwsearch.modelserver.runtime import grpc_service, limits_from, serve_model
from dwsearch.v1 import reranker_pb2_grpc as pb_grpc
from dwsearch_reranker.backends import select_backend
from dwsearch_reranker.backends.base import RerankBackend
from dwsearch_reranker.engine import Reranker, RerankLimits
from dwsearch_reranker.http import RerankerHttp
from dwsearch_reranker.service import SERVICE_NAME, RerankerServicer


def build_engine(cfg: RerankerConfig, backend: RerankBackend | None = None) -> Reranker:
    limits = limits_from(cfg, RerankLimits, max_documents_per_request=cfg.max_documents_per_request)
    return Reranker(backend or select_backend(cfg), limits)


async def run_reranker(cfg: RerankerConfig, backend: RerankBackend | None = None) -> None:
    """Serve until SIGTERM (see serve_model). `backend` replaces the configured one."""
    await serve_model(
        cfg,
        lambda: [build_engine(cfg, backend)],
        lambda engines: grpc_service(
            SERVICE_NAME, pb_grpc.add_RerankerServiceServicer_to_server, RerankerServicer(engines[0])
        ),
        process="reranker",
        make_http=lambda engines, state: RerankerHttp(engines[0], state).app(),
    )
