"""The REST API on uvicorn, in serve's process and event loop beside the gRPC server."""

from __future__ import annotations

import logging

import uvicorn

from dwsearch.common.config import ServerConfig
from dwsearch.common.connections import (
    ACCEPT_BURST,
    ConnectionGate,
    ConnectionLimits,
    raise_fd_limit,
    tls_context,
)
from dwsearch.common.errors import StartupError
from dwsearch.common.uvicornhost import UvicornHost
from dwsearch.index.document_index import IndexParts
from dwsearch.rest.app import ENDPOINTS, RestApi
from dwsearch.rest.indexfile import load_indexes
from dwsearch.rest.upstash import build_rest_indexes

log = logging.getLogger(__name__)


class RestServer:
    def __init__(
        self,
        api: RestApi,
        host: str,
        port: int,
        *,
        tls_cert: str = "",
        tls_key: str = "",
        tls_client_ca: str = "",
        max_connections: int = ConnectionLimits.max_connections,
        header_timeout: float = ConnectionLimits.header_timeout,
        body_timeout: float = ConnectionLimits.body_timeout,
    ) -> None:
        """TLS as serve's gRPC port has it (DWSEARCH_TLS_CERT / _KEY; _CLIENT_CA: mutual TLS),
        started by the ConnectionGate, which also caps the open connections and puts
        deadlines on each request's head and body (dwsearch.common.connections)."""
        self.limits = ConnectionLimits(max_connections, header_timeout, body_timeout)
        self.gate = ConnectionGate(self.limits, tls_context(tls_cert, tls_key, tls_client_ca))
        config = uvicorn.Config(
            api.app(), host=host, port=port, lifespan="off", log_config=None, access_log=False,
            server_header=False, timeout_graceful_shutdown=10, http=self.gate.protocol(),
            ws="none",  # an upgrade would hand the socket to a protocol the gate does not count
            backlog=ACCEPT_BURST,
        )  # fmt: skip
        # A request's span names its index and endpoint, never a namespace or an id.
        self.host = UvicornHost(config, "the REST API", routes={*api.indexes, *ENDPOINTS})
        self.api = api

    async def start(self) -> None:
        raise_fd_limit(self.limits.max_connections)
        await self.api.prepare()
        await self.host.start()

    @property
    def port(self) -> int:
        return self.host.port

    async def stop(self) -> None:
        await self.host.stop()
        self.gate.close_all()


def rest_api(config: ServerConfig, parts: IndexParts) -> RestApi | None:
    """serve's REST API over its indexes (DWSEARCH_REST_INDEXES' file, each a DocumentIndex
    of `parts`), or None when DWSEARCH_REST_PORT is unset: built by the composition root
    (dwsearch.serve.build_application)."""
    if not config.rest_port:
        return None
    if not config.rest_indexes:
        raise StartupError(
            "DWSEARCH_REST_PORT is set: DWSEARCH_REST_INDEXES must name the indexes' TOML file"
        )
    indexes = build_rest_indexes(parts, load_indexes(config.rest_indexes), embed_model=config.embed_model)
    return RestApi(indexes, max_body_bytes=config.max_upsert_bytes)


def rest_server(config: ServerConfig, api: RestApi) -> RestServer:
    """The REST API's transport: uvicorn on DWSEARCH_REST_HOST:DWSEARCH_REST_PORT, with
    serve's TLS and the REST connection limits."""
    return RestServer(
        api,
        config.rest_host,
        config.rest_port,
        tls_cert=config.tls_cert,
        tls_key=config.tls_key,
        tls_client_ca=config.tls_client_ca,
        max_connections=config.rest_max_connections,
        header_timeout=config.rest_header_timeout_seconds,
        body_timeout=config.rest_body_timeout_seconds,
    )
