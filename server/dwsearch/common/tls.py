"""Optional TLS for every gRPC hop: the servers (serve, embedder, reranker) present a
certificate, and with a client CA require one from their clients (mutual TLS); the
clients (serve → embedder / reranker, `dwsearch sweep` / `purge` → serve) verify the
server against a CA and may present a certificate of their own. PEM files are read once
at start-up; a missing or unreadable file stops the process with its setting's name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


def _read(path: str, setting: str) -> bytes:
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise SystemExit(f"{setting}: cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise SystemExit(f"{setting}: {path} is not a PEM file")
    return data


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and key; `client_ca` set = mutual TLS."""

    cert: bytes
    key: bytes
    client_ca: bytes | None = None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


@dataclass(frozen=True)
class ClientTls:
    """The CA a client verifies servers against, and its own certificate for mutual TLS."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def server_tls(cert: str, key: str, client_ca: str = "") -> ServerTls | None:
    """From DWSEARCH_TLS_CERT / _KEY / _CLIENT_CA; None (plaintext) when no certificate."""
    if not cert and not key:
        if client_ca:
            raise SystemExit("DWSEARCH_TLS_CLIENT_CA needs DWSEARCH_TLS_CERT and DWSEARCH_TLS_KEY")
        return None
    if not (cert and key):
        raise SystemExit("DWSEARCH_TLS_CERT and DWSEARCH_TLS_KEY go together")
    return ServerTls(
        cert=_read(cert, "DWSEARCH_TLS_CERT"),
        key=_read(key, "DWSEARCH_TLS_KEY"),
        client_ca=_read(client_ca, "DWSEARCH_TLS_CLIENT_CA") if client_ca else None,
    )


def client_tls(ca: str, cert: str = "", key: str = "") -> ClientTls | None:
    """From DWSEARCH_TLS_CA / _CLIENT_CERT / _CLIENT_KEY; None (plaintext) when no CA."""
    if not ca:
        if cert or key:
            raise SystemExit("DWSEARCH_TLS_CLIENT_CERT / _KEY need DWSEARCH_TLS_CA")
        return None
    if bool(cert) != bool(key):
        raise SystemExit("DWSEARCH_TLS_CLIENT_CERT and DWSEARCH_TLS_CLIENT_KEY go together")
    return ClientTls(
        ca=_read(ca, "DWSEARCH_TLS_CA"),
        cert=_read(cert, "DWSEARCH_TLS_CLIENT_CERT") if cert else None,
        key=_read(key, "DWSEARCH_TLS_CLIENT_KEY") if key else None,
    )
