"""Free loopback ports for the servers a process starts: a local Citus cluster's nodes
(dwsearch.db.citus), and the processes and servers of the tests and benchmarks
(dwsearch_testkit.net)."""

from __future__ import annotations

import socket
import threading
from collections import deque

# The ports handed out lately: the OS may offer a port just released again at once, so two
# calls before either server binds could name the same port (a fake embedder then answered
# on serve's address: "UNIMPLEMENTED: Method not found" in a reliability test).
_RECENT: deque[int] = deque(maxlen=256)
_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now: bound to port 0, then released for
    the caller's server to bind (or for a client to find closed); never one this process
    was given among its last 256."""
    with _LOCK:
        for _ in range(64):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _RECENT:
                _RECENT.append(port)
                return port
        raise RuntimeError("no free port found that this process was not given lately")
