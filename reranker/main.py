"""`dwsearch reranker`: the RerankerService process."""

from __future__ import annotations

from dwsearch.common.config import RerankerConfig
from dwsearch.common.grpcserver import GrpcHost, Service, run_until_signalled
from dwsearch.common.metrics import serve_metrics
from dwsearch.common.tls import server_tls
from dwsearch.embedder.runtime import StartupError
from dwsearch.reranker.backends.base import RerankBackend
from dwsearch.reranker.backends.cross_encoder import CrossEncoderBackend
from dwsearch.reranker.engine import Reranker, RerankLimits
from dwsearch.reranker.service import SERVICE_NAME, RerankerServicer
from dwsearch.v1 import reranker_pb2_grpc as pb_grpc


def build_engine(cfg: RerankerConfig, backend: RerankBackend | None = None) -> Reranker:
    limits = RerankLimits(
        max_batch_tokens=cfg.max_batch_tokens,
        max_batch_inputs=cfg.max_batch_inputs,
        max_queue=cfg.max_queue,
        max_documents_per_request=cfg.max_documents_per_request,
    )
    backend = backend or CrossEncoderBackend(
        cfg.rerank_model,
        model_id=cfg.rerank_model_id,
        max_length=cfg.rerank_max_length,
        device=cfg.device,
        dtype=cfg.dtype,
    )
    return Reranker(backend, limits)


async def run_reranker(cfg: RerankerConfig, backend: RerankBackend | None = None) -> None:
    """Serve until SIGTERM, as the embedder does. `backend` replaces the configured one."""
    try:
        engine = build_engine(cfg, backend)
        servicer = RerankerServicer(engine)
        host = GrpcHost(
            cfg.listen_addr,
            [Service(SERVICE_NAME, lambda server: pb_grpc.add_RerankerServiceServicer_to_server(servicer, server))],
            auth_token=cfg.auth_token,
            max_connection_age_s=cfg.max_connection_age_seconds,
            tls=server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca),
            health_port=cfg.health_port,
        )
        serve_metrics(cfg.metrics_port)
        await run_until_signalled(
            host, ready=engine.start, cleanup=engine.stop, grace=cfg.grace_seconds, process="reranker"
        )
    except StartupError as exc:
        raise SystemExit(f"reranker: {exc}") from None
