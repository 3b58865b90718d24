"""The soak's nemesis: a schedule of faults, drawn from a seed and logged with the times
each began and healed. Faults come between the fault-free start (the baseline the checker
compares with) and the fault-free end (two sweep periods and more, for the checker's
settled state), one at a time, with quiet gaps between them:

- embedder-kill: SIGKILL, a pod's OOM kill; started again on the same port after a while;
- embedder-freeze: SIGSTOP for longer than every deadline, then SIGCONT;
- reranker-slow: the reranker stopped and continued in turns (SIGSTOP / SIGCONT), each
  Rerank slowed past its 2 s deadline now and then;
- serve-restart: serve a stopped (SIGTERM, its calls drained) and started again, as a
  rolling deploy does; b stays up, so its memory is measured over the whole run;
- pg-restart-fast / pg-restart-immediate: the primary (the coordinator on Citus)
  restarted: every session ended; immediate is a crash with WAL recovery;
- replica-stop: the standby stopped, then started (reads fall back to the primary);
- terminate-backends: pg_terminate_backend of every client session;
- worker-stop (Citus): a worker stopped (immediate) and started again."""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass

import psycopg

from bench.soak.stack import Stack
from bench.soak.workload import History

ONE_NODE = ("embedder-kill", "embedder-freeze", "reranker-slow", "serve-restart", "pg-restart-fast",
            "pg-restart-immediate", "replica-stop", "terminate-backends")  # fmt: skip
CITUS = ("embedder-kill", "embedder-freeze", "reranker-slow", "serve-restart", "pg-restart-fast",
         "terminate-backends", "worker-stop")  # fmt: skip
QUICK = ("embedder-kill", "embedder-freeze", "serve-restart", "pg-restart-fast", "terminate-backends")
# Seconds each fault lasts (before it heals) in a full run; a quick run halves them.
HOLD_S = {"embedder-kill": 20, "embedder-freeze": 25, "reranker-slow": 40, "serve-restart": 0,
          "pg-restart-fast": 0, "pg-restart-immediate": 0, "replica-stop": 45, "terminate-backends": 0,
          "worker-stop": 40}  # fmt: skip
BASELINE_SHARE = 0.2  # the fault-free start
QUIET_END_SHARE = 0.25  # the fault-free end


@dataclass(frozen=True)
class Fault:
    at_s: float
    name: str
    hold_s: float


def schedule(names: tuple[str, ...], duration_s: float, seed: int, rounds: int, quick: bool) -> list[Fault]:
    """Every fault `rounds` times (a worker stop at least twice), shuffled, spread evenly
    over the middle of the run."""
    rng = random.Random(seed)
    drawn = [name for _ in range(rounds) for name in names]
    if "worker-stop" in names and rounds < 2:
        drawn.append("worker-stop")
    rng.shuffle(drawn)
    begin, end = duration_s * BASELINE_SHARE, duration_s * (1 - QUIET_END_SHARE)
    step = (end - begin) / len(drawn)
    return [
        Fault(
            round(begin + i * step + rng.uniform(0, step * 0.3), 1), name, HOLD_S[name] / (2 if quick else 1)
        )
        for i, name in enumerate(drawn)
    ]


class Nemesis:
    def __init__(self, stack: Stack, history: History, faults: list[Fault]) -> None:
        self.stack = stack
        self.history = history
        self.faults = faults
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        for fault in self.faults:
            if self.stop.wait(max(0.0, fault.at_s - self.history.now())):
                return
            began = self.history.now()
            error = ""
            try:
                self._apply(fault)
            except Exception as exc:  # recorded: a fault the harness could not apply or heal
                error = repr(exc)[:300]
            self.history.add(op="fault", fault=fault.name, t=round(began, 3), healed=round(self.history.now(), 3),
                             error=error)  # fmt: skip

    def _apply(self, fault: Fault) -> None:
        getattr(self, "_" + fault.name.replace("-", "_"))(fault.hold_s)

    # --- the faults ----------------------------------------------------------------------------

    def _embedder_kill(self, hold: float) -> None:
        embedder = self.stack.embedder
        assert embedder is not None
        embedder.kill()
        time.sleep(hold)
        embedder.restart()

    def _embedder_freeze(self, hold: float) -> None:
        self._stopped(self.stack.embedder, hold)

    def _reranker_slow(self, hold: float) -> None:
        proc = self.stack.reranker.proc if self.stack.reranker else None
        assert proc is not None
        until = time.monotonic() + hold
        while time.monotonic() < until:
            proc.send_signal(signal.SIGSTOP)
            time.sleep(1.6)
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.6)

    def _stopped(self, thing: object, hold: float) -> None:
        proc = getattr(thing, "proc", None)
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(hold)
        finally:
            proc.send_signal(signal.SIGCONT)

    def _serve_restart(self, hold: float) -> None:
        serve = self.stack.serves["a"]
        rc = serve.stop(timeout=60)
        self.history.add(op="serve-exit", rc=rc)
        serve.start()

    def _pg_restart(self, mode: str) -> None:
        if self.stack.cluster is not None:
            cluster = self.stack.cluster
            cluster.stop_node(0, mode)  # type: ignore[attr-defined]
            cluster.start_node(0)  # type: ignore[attr-defined]
        else:
            self.stack.replica.restart_primary(mode)  # type: ignore[union-attr]

    def _pg_restart_fast(self, hold: float) -> None:
        self._pg_restart("fast")

    def _pg_restart_immediate(self, hold: float) -> None:
        self._pg_restart("immediate")

    def _replica_stop(self, hold: float) -> None:
        replica = self.stack.replica
        assert replica is not None
        replica.stop_standby("fast")  # type: ignore[attr-defined]
        time.sleep(hold)
        replica.start_standby()  # type: ignore[attr-defined]

    def _terminate_backends(self, hold: float) -> None:
        with psycopg.connect(self.stack.primary_url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                   WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"""
            ).fetchone()
        self.history.add(op="terminated", sessions=row[0] if row else 0)

    def _worker_stop(self, hold: float) -> None:
        cluster = self.stack.cluster
        assert cluster is not None
        worker = (
            1
            + sum(1 for r in self.history.of("fault") if r["fault"] == "worker-stop")
            % self.stack.citus_workers
        )
        cluster.stop_node(worker, "immediate")  # type: ignore[attr-defined]
        time.sleep(hold)
        cluster.start_node(worker)  # type: ignore[attr-defined]


def windows(history: History, grace_s: float) -> list[tuple[str, float, float]]:
    """(fault, start, end) of every fault, its end `grace_s` after it healed."""
    return [(r["fault"], r["t"], r["healed"] + grace_s) for r in history.of("fault")]
