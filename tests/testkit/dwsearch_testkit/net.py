"""Ports for the processes and servers a test or a benchmark starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now: bound to port 0, then released for
    the caller's server to bind (or for a client to find closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
