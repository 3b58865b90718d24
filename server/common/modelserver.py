"""Running a model service process (`dwsearch embedder`, `dwsearch reranker`): one gRPC
service in front of an engine that loads its model before the process turns SERVING."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from dwsearch.common.config import EmbedderConfig, RerankerConfig
from dwsearch.common.errors import StartupError
from dwsearch.common.grpcserver import GrpcHost, Service, run_until_signalled
from dwsearch.common.metrics import serve_metrics
from dwsearch.common.threads import apply_thread_env, resolve_threads
from dwsearch.common.tls import server_tls


class Engine(Protocol):
    async def start(self) -> None:
        """Load the model and warm it up."""

    async def stop(self) -> None:
        """Release what start() took."""


E = TypeVar("E", bound=Engine)

# A request message is its texts plus a few bytes of framing per input and field.
RECEIVE_SLACK_BYTES = 256 * 1024


async def serve_model(
    cfg: EmbedderConfig | RerankerConfig,
    make_engine: Callable[[], E],
    make_service: Callable[[E], Service],
    *,
    process: str,
) -> None:
    """Serve until SIGTERM: NOT_SERVING while the model loads and warms up, SERVING after,
    draining in-flight calls on the signal. A StartupError (a model that cannot be found
    or loaded, contradictory settings) exits naming the process, without a traceback."""
    try:
        # Before any model library starts its thread pools (they are imported when the model loads).
        apply_thread_env(resolve_threads(cfg.threads))
        engine = make_engine()
        host = GrpcHost(
            cfg.listen_addr,
            [make_service(engine)],
            auth_token=cfg.auth_token,
            max_connection_age_s=cfg.max_connection_age_seconds,
            tls=server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca),
            health_port=cfg.health_port,
            reflection=cfg.reflection,
            # The text cap plus room for the message's framing (a few bytes per input).
            max_receive_bytes=cfg.max_request_bytes + RECEIVE_SLACK_BYTES,
        )
        serve_metrics(cfg.metrics_port)
        await run_until_signalled(
            host, ready=engine.start, cleanup=engine.stop, grace=cfg.grace_seconds, process=process
        )
    except StartupError as exc:
        raise SystemExit(f"{process}: {exc}") from None
