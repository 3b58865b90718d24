"""`dwsearch embedder`: the EmbedderService process."""

from __future__ import annotations

from dwsearch.common.config import EmbedderConfig
from dwsearch.common.grpcserver import GrpcHost, Service, run_until_signalled
from dwsearch.common.metrics import serve_metrics
from dwsearch.common.tls import server_tls
from dwsearch.embedder.backends import select_backend
from dwsearch.embedder.backends.base import EmbeddingBackend
from dwsearch.embedder.engine import Embedder, EngineLimits
from dwsearch.embedder.runtime import StartupError
from dwsearch.embedder.service import SERVICE_NAME, EmbedderServicer
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc


def build_engine(cfg: EmbedderConfig, backend: EmbeddingBackend | None = None) -> Embedder:
    limits = EngineLimits(
        max_batch_tokens=cfg.max_batch_tokens,
        max_batch_inputs=cfg.max_batch_inputs,
        max_queue=cfg.max_queue,
        max_inputs_per_request=cfg.max_inputs_per_request,
        max_input_tokens=cfg.max_input_tokens,
    )
    return Embedder(backend or select_backend(cfg), limits)


async def run_embedder(cfg: EmbedderConfig, backend: EmbeddingBackend | None = None) -> None:
    """Serve until SIGTERM: NOT_SERVING while the model loads and warms up, SERVING after,
    draining in-flight calls on the signal. `backend` replaces the configured one."""
    try:
        engine = build_engine(cfg, backend)
        servicer = EmbedderServicer(engine)
        host = GrpcHost(
            cfg.listen_addr,
            [Service(SERVICE_NAME, lambda server: pb_grpc.add_EmbedderServiceServicer_to_server(servicer, server))],
            auth_token=cfg.auth_token,
            max_connection_age_s=cfg.max_connection_age_seconds,
            tls=server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca),
            health_port=cfg.health_port,
        )
        serve_metrics(cfg.metrics_port)
        await run_until_signalled(
            host, ready=engine.start, cleanup=engine.stop, grace=cfg.grace_seconds, process="embedder"
        )
    except StartupError as exc:
        raise SystemExit(f"embedder: {exc}") from None
