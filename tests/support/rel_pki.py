"""A throw-away PKI for the TLS tests, made with the `openssl` command line (the
`cryptography` package is not a dependency): a CA, a server certificate for localhost /
127.0.0.1, a client certificate it signed, and a client certificate of another CA."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import grpc


def openssl_missing() -> str | None:
    """Why the TLS tests cannot run here, or None."""
    if shutil.which("openssl") is None:
        return "the openssl command line is not installed; it makes the test certificates"
    return None


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key_and_csr(directory: Path, name: str, subject: str) -> None:
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=directory)  # fmt: skip


def _ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)  # fmt: skip


def _sign(directory: Path, name: str, ca: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
             cwd=directory)  # fmt: skip


@dataclass(frozen=True)
class Pki:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def read(self, name: str) -> bytes:
        return (self.dir / name).read_bytes()

    def credentials(self, client: str | None = "client") -> grpc.ChannelCredentials:
        """Channel credentials trusting the CA, presenting `client`'s certificate (None: none)."""
        if client is None:
            return grpc.ssl_channel_credentials(root_certificates=self.read("ca.pem"))
        return grpc.ssl_channel_credentials(
            root_certificates=self.read("ca.pem"),
            private_key=self.read(f"{client}.key"),
            certificate_chain=self.read(f"{client}.pem"),
        )


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _key_and_csr(directory, "server", "/CN=localhost")
    _sign(directory, "server", "ca",
          "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")  # fmt: skip
    _key_and_csr(directory, "client", "/CN=dwsearch-client")
    _sign(directory, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _ca(directory, "rogue-ca")
    _key_and_csr(directory, "rogue", "/CN=dwsearch-client")
    _sign(directory, "rogue", "rogue-ca", "extendedKeyUsage=clientAuth\n")
    return Pki(directory)
