"""The whole stack as local processes on the embedded defaults: Postgres (embedded unless
DWSEARCH_DATABASE_URL is set), migrations with the Go-owned dev tables, the embedder,
optionally the reranker, and the server. Used by `dwsearch dev` and `dwsearch demo`."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import grpc
from grpc_health.v1 import health_pb2

from dwsearch.common.config import StackConfig
from dwsearch.common.errors import StartupError
from dwsearch.db import citus
from dwsearch.db.citus import CitusCluster
from dwsearch.db.embedded import database_url
from dwsearch.db.migrate import migrate

SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass
class Process:
    name: str
    address: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def health(self, timeout: float = 1.0) -> str:
        """SERVING / NOT_SERVING / UNREACHABLE / EXITED (code)."""
        if self.popen is not None and self.popen.poll() is not None:
            return f"EXITED ({self.popen.returncode})"
        try:
            with grpc.insecure_channel(self.address) as channel:
                # The method itself: types-grpcio-health-checking's HealthStub declares no methods.
                check = channel.unary_unary(
                    "/grpc.health.v1.Health/Check",
                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                    response_deserializer=health_pb2.HealthCheckResponse.FromString,
                )
                status = check(health_pb2.HealthCheckRequest(), timeout=timeout)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)
        except grpc.RpcError:
            return "UNREACHABLE"

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def shown_url(url: str) -> str:
    """A database URL to print: its password, if any, replaced by ***."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


CITUS_DIR = "citus"
"""The local Citus cluster's directory under DWSEARCH_DATA_DIR (the embedded server's is `pg`)."""

# The dev cluster's data is kept: written to disk as a database's is (the tests' clusters,
# thrown away, skip it).
DURABLE = {"fsync": "on", "full_page_writes": "on"}


def start_cluster(config: StackConfig) -> CitusCluster:
    """--citus-workers: the local cluster in DWSEARCH_DATA_DIR/citus, kept there as the
    embedded server's data is: made by the first start, started again with its data by the
    next, each node on --citus-port's port (coordinator, then worker N on it + N) when it is
    set, else on free ports the first time and the same ports after."""
    workers, base = config.citus_workers, config.citus_port
    ports = [base + node for node in range(workers + 1)] if base else []
    if ports and ports[-1] > 65535:
        raise StartupError(f"--citus-port {base}: {workers + 1} ports from it pass 65535")
    try:
        return CitusCluster(
            citus.build(citus.find_source(config.citus_source)),
            workers=workers,
            root=Path(config.data_dir).expanduser() / CITUS_DIR,
            ports=ports,
            settings=dict(DURABLE),
            keep=True,
        ).start()
    except citus.CitusUnavailable as exc:
        raise StartupError(str(exc)) from None


@dataclass
class LocalStack:
    config: StackConfig
    url: str = ""
    processes: list[Process] = field(default_factory=list)
    cluster: CitusCluster | None = None  # --citus-workers: the local cluster the stack runs on

    @property
    def server_address(self) -> str:
        return f"{self.config.host}:{self.config.server_port}"

    def start(self) -> None:
        """The database (or the local Citus cluster), migrations, then the processes; what
        was started is stopped again when a later step fails."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def start_database(self) -> None:
        """The database: the local Citus cluster (--citus-workers), the embedded server or
        DWSEARCH_DATABASE_URL's, migrated; its URL printed (a cluster's: every node's,
        the coordinator first)."""
        cfg = self.config
        if cfg.citus_workers:
            if cfg.database_url:
                raise StartupError(
                    "--citus-workers starts a local cluster: leave DWSEARCH_DATABASE_URL unset"
                )
            self.cluster = start_cluster(cfg)
            self.url = self.cluster.coordinator_url
            where = (
                f"Citus, a coordinator and {cfg.citus_workers} worker(s) "
                + ("started again with their data" if self.cluster.restarted else "made")
                + f" in {self.cluster.nodes}; kept there at stop"
            )
        else:
            self.url = database_url(cfg.database_url, cfg.data_dir)
            where = "embedded, " + str(cfg.data_dir) if not cfg.database_url else "DWSEARCH_DATABASE_URL"
        applied = migrate(self.url, dev_schema=True)
        print(f"database   ready ({where}); {len(applied)} migration(s) applied")
        # Where to load your own chat (README "Load your own chat and see it searched"), and
        # with --citus-workers every node's URL, for psql.
        print(f"database   {shown_url(self.url)}" + (" (the coordinator)" if self.cluster else ""))
        if self.cluster is not None:
            for node, url in enumerate(self.cluster.worker_urls, 1):
                print(f"{'worker ' + str(node):<10} {url}")

    def _start(self) -> None:
        cfg = self.config
        self.start_database()
        logs = Path(cfg.data_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        cli = [sys.executable, "-m", "dwsearch.cli"]
        # --health-port 0: a DWSEARCH_HEALTH_PORT in the caller's environment would make the
        # three processes fight over one port.
        common = ["--log-level", cfg.log_level, "--log-format", "json", "--health-port", "0"]
        embedder_addr = f"{cfg.host}:{cfg.embedder_port}"
        self.processes = [
            Process(
                "embedder",
                embedder_addr,
                [
                    *cli,
                    "embedder",
                    *common,
                    "--listen-addr",
                    embedder_addr,
                    "--embed-model",
                    cfg.model,
                    "--embed-backend",
                    cfg.embed_backend,
                ],
                logs / "embedder.log",
            )
        ]
        reranker_addr = ""
        if cfg.reranker_port:
            reranker_addr = f"{cfg.host}:{cfg.reranker_port}"
            self.processes.append(
                Process(
                    "reranker",
                    reranker_addr,
                    [
                        *cli,
                        "reranker",
                        *common,
                        "--listen-addr",
                        reranker_addr,
                        "--rerank-model",
                        cfg.rerank_model,
                    ],
                    logs / "reranker.log",
                )
            )
        self.processes.append(
            Process(
                "server",
                self.server_address,
                [
                    *cli,
                    "serve",
                    *common,
                    "--listen-addr",
                    self.server_address,
                    "--embedder-addr",
                    embedder_addr,
                    "--reranker-addr",
                    reranker_addr,
                    "--embed-model",
                    cfg.model,
                    *(
                        ["--console-port", str(cfg.console_port), "--console-host", cfg.host]
                        if cfg.console_port
                        else []
                    ),
                    "--embed-timeout-ms",
                    str(cfg.embed_timeout_ms),
                    *(["--rest-port", str(cfg.rest_port), "--rest-host", cfg.host] if cfg.rest_port else []),
                ],
                logs / "server.log",
            )
        )
        env = {
            **os.environ,
            "DWSEARCH_DATABASE_URL": self.url,
            "HF_HUB_OFFLINE": "1",
            "GRPC_VERBOSITY": "ERROR",
        }
        if cfg.auth_token:
            env["DWSEARCH_AUTH_TOKEN"] = cfg.auth_token
        # A development stack describes its API (grpcurl, Postman); production does not.
        env.setdefault("DWSEARCH_REFLECTION", "true")
        for proc in self.processes:
            log = proc.log_path.open("ab")
            proc.popen = subprocess.Popen(proc.argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        self._wait_until_serving()

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout
        pending = list(self.processes)
        while pending:
            for proc in list(pending):
                status = proc.health()
                if status == "SERVING":
                    pending.remove(proc)
                elif status.startswith("EXITED"):
                    self.stop()
                    raise SystemExit(f"{proc.name} {status.lower()}; last log lines:\n{proc.log_tail()}")
            if pending and time.monotonic() > deadline:
                names = ", ".join(p.name for p in pending)
                self.stop()
                raise SystemExit(
                    f"{names} not SERVING after {self.config.startup_timeout:.0f}s; logs in "
                    f"{pending[0].log_path.parent}"
                )
            time.sleep(0.25)

    @property
    def console_url(self) -> str:
        """The server's web console, or "" when it is off."""
        port = self.config.console_port
        return f"http://{self.config.host}:{port}/" if port else ""

    def print_status(self) -> None:
        for proc in self.processes:
            print(f"{proc.name:<10} {proc.address:<22} {proc.health():<12} log {proc.log_path}")
        if self.console_url:
            print(f"{'console':<10} {self.console_url}")

    def stop(self) -> None:
        for proc in self.processes:
            if proc.popen is not None and proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.processes:
            if proc.popen is not None:
                try:
                    proc.popen.wait(timeout=self.config.grace_seconds + 5)
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
        if self.cluster is not None:
            self.cluster.close()

    def wait(self) -> int:
        """Block until Ctrl-C / SIGTERM or a process exits; then stop everything."""
        stopping = False

        def on_signal(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            while not stopping:
                exited = [
                    (p.name, code)
                    for p in self.processes
                    if p.popen is not None and (code := p.popen.poll()) is not None
                ]
                if exited:
                    print(
                        f"{exited[0][0]} exited ({exited[0][1]}); stopping the stack",
                        file=sys.stderr,
                    )
                    return 1
                time.sleep(0.5)
            return 0
        finally:
            self.stop()


DEV_CONSOLE_PORT = 8090
"""Where `dwsearch dev` (and `dwsearch demo --keep-running`) serves the web console when
DWSEARCH_CONSOLE_PORT names no port: this one, or a free one when another process has it."""


def with_console(config: StackConfig) -> StackConfig:
    """`config` with the console on: its port, else DEV_CONSOLE_PORT, else a free port."""
    if config.console_port:
        return config
    with socket.socket() as probe:
        try:
            probe.bind((config.host, DEV_CONSOLE_PORT))
            port = DEV_CONSOLE_PORT
        except OSError:
            probe.bind((config.host, 0))
            port = probe.getsockname()[1]
    return dataclasses.replace(config, console_port=port)


def run_dev(config: StackConfig) -> int:
    config = with_console(config)  # dev always serves the console
    stack = LocalStack(config)
    stack.start()
    stack.print_status()
    print("\nstack running; Ctrl-C stops it")
    return stack.wait()
