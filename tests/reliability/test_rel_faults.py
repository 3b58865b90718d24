"""Faults with real processes over loopback: `dwsearch serve`, the fake model services as
processes (killed, stalled, slowed), `dwsearch sweep` as the CronJob runs it, and a
Postgres of these tests' own that is restarted under load. Each test cuts at a point it
waits for (an Embed call arriving), never after a fixed sleep, and then checks what must
hold whatever the timing: the sweep's consistency invariants and exactly-once windows."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import pytest

from dwsearch.index.service import to_struct
from dwsearch.sweep.commands import EXIT_ALL_STALLED, EXIT_FAILED, EXIT_OK
from dwsearch.v1 import index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc, sweep_pb2, sweep_pb2_grpc
from dwsearch_testkit.procs import FakeModel, Serve, run_dwsearch, running, start_dwsearch, wait_until
from dwsearch_testkit.reldb import (
    check_exactly_once,
    check_sweep_consistency,
    embedded_windows,
    fingerprint,
    seed_sessions,
)

pytestmark = pytest.mark.slow

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
# Pool size of the server under test: after a database restart each pooled connection
# fails at most one call, so this bounds the calls that fail before it recovers.
POOL_MAX = 4
_SUMMARY = re.compile(
    r"(?P<embedded>\d+) windows embedded, (?P<skipped>\d+) skipped, (?P<poisoned>\d+) poisoned; .*"
    r"keys: (?P<keys>\d+) with work, (?P<done>\d+) caught up, (?P<stalled>\d+) stalled, (?P<locked>\d+) left"
)


@dataclass
class Sweep:
    code: int
    out: str
    err: str

    @property
    def summary(self) -> dict[str, int]:
        match = _SUMMARY.search(self.out)
        assert match, f"no summary in {self.out!r} / {self.err!r}"
        return {k: int(v) for k, v in match.groupdict().items()}


def sweep(serve: Serve) -> Sweep:
    done = run_dwsearch("sweep", "--server-addr", serve.address)
    return Sweep(done.returncode, done.stdout, done.stderr)


def finish(proc: subprocess.Popen) -> Sweep:
    out, err = proc.communicate(timeout=120)
    return Sweep(proc.returncode, out, err)


def sweep_until_clean(serve: Serve, attempts: int = POOL_MAX + 3) -> Sweep:
    """Sweep until a run has nothing stalled and nothing left to another sweeper (a
    killed server's locks and a restarted database's dead connections go within a few)."""
    for _ in range(attempts):
        result = sweep(serve)
        if result.code == EXIT_OK and result.summary["stalled"] == 0 and result.summary["locked"] == 0:
            return result
    raise AssertionError(f"no clean sweep in {attempts} attempts; last: {result}")


def serve_for(url: str, embedder: FakeModel, tmp_path, name: str = "serve", **env: str) -> Serve:
    return Serve(
        url, embedder.address, tmp_path / f"{name}.log",
        env={"DWSEARCH_DB_POOL_MAX": str(POOL_MAX), "DWSEARCH_EMBED_TIMEOUT_MS": "10000", **env},
    )  # fmt: skip


def search(serve: Serve, **fields) -> search_pb2.SearchResponse:
    fields.setdefault("org_id", "org-a")
    fields.setdefault("query", "parcel refund")
    with grpc.insecure_channel(serve.address) as channel:
        return search_pb2_grpc.SearchServiceStub(channel).Search(
            search_pb2.SearchRequest(**fields), timeout=60
        )


def status(serve: Serve) -> sweep_pb2.StatusResponse:
    with grpc.insecure_channel(serve.address) as channel:
        return sweep_pb2_grpc.SweepServiceStub(channel).Status(sweep_pb2.StatusRequest(), timeout=60)


def wait_embedder_reachable(serve: Serve) -> None:
    """The server's channel reconnects to a restarted embedder within seconds: poll a
    search until it is no longer degraded."""
    wait_until(lambda: not search(serve).degraded, 30, "the server to reach the embedder again", interval=0.2)


def calls_until_ok(call, limit: int):
    """Call until one succeeds; every failure must be UNAVAILABLE. Returns (failures,
    the first success)."""
    failures = 0
    for _ in range(limit):
        try:
            return failures, call()
        except grpc.RpcError as exc:
            assert exc.code() == UNAVAILABLE, exc
            failures += 1
    raise AssertionError(f"still failing after {limit} calls")


# --- the embedder ---------------------------------------------------------------------


def test_embedder_killed_mid_sweep_stalls_and_the_next_sweep_completes_exactly_once(db_url, tmp_path):
    windows = seed_sessions(db_url, ["org-a", "org-b"], channels=3, sessions=3, messages=3)
    embedder = FakeModel("embedder")
    serve = serve_for(db_url, embedder, tmp_path)
    with running(embedder, serve):
        embedder.start()
        serve.start()
        embedder.send("hold")
        running_sweep = start_dwsearch("sweep", "--server-addr", serve.address)
        embedder.wait_for("embed ")  # windows are on their way to the model
        embedder.kill()
        first = finish(running_sweep)

        # Reported: every key stalled on the outage (nothing could finish), named.
        assert first.code == EXIT_ALL_STALLED, first
        assert first.summary["stalled"] == 6 and "UNAVAILABLE" in first.err
        assert embedded_windows(db_url) == []
        check_sweep_consistency(db_url)
        # An outage only stalls: no window is blamed (no failure counted, no poison).
        state = status(serve)
        assert state.poison_windows == [] and any("UNAVAILABLE" in w.last_error for w in state.watermarks)
        assert all(w.consecutive_failures == 0 for w in state.watermarks)

        embedder.restart()  # the pod comes back
        wait_embedder_reachable(serve)
        sent_before = len(embedder.embedded_inputs())  # the killed pod never answered those
        second = sweep(serve)
        assert second.code == EXIT_OK and second.summary == {
            "embedded": 18, "skipped": 0, "poisoned": 0, "keys": 6, "done": 6, "stalled": 0, "locked": 0,
        }, second  # fmt: skip
        check_exactly_once(db_url, windows)
        check_sweep_consistency(db_url)
        assert sweep(serve).summary["keys"] == 0  # nothing left: the rerun is a no-op
        assert max(Counter(embedder.embedded_inputs()[sent_before:]).values()) == 1


def test_slow_embedder_search_degrades_within_its_deadline(db_url, tmp_path):
    seed_sessions(db_url, ["org-a"], channels=2, sessions=1, messages=3)
    embedder = FakeModel("embedder", None, "--delay", "30")
    serve = serve_for(db_url, embedder, tmp_path, DWSEARCH_EMBED_TIMEOUT_MS="300")  # production's default
    with running(embedder, serve):
        embedder.start()
        serve.start()
        for mode in (search_pb2.SEARCH_MODE_HYBRID, search_pb2.SEARCH_MODE_SEMANTIC):
            started = time.monotonic()
            response = search(serve, mode=mode)
            elapsed = time.monotonic() - started
            print(
                f"search with a 30 s embedder, 300 ms deadline, mode {search_pb2.SearchMode.Name(mode)}: answered in {elapsed * 1000:.0f} ms"
            )
            assert elapsed < 5.0  # the deadline plus FTS, far from the embedder's 30 s
            assert response.degraded
            assert [d.reason for d in response.degradations] == [
                search_pb2.DEGRADATION_REASON_EMBEDDER_TIMEOUT
            ]
            assert len(response.hits) == 6  # full-text search still answers: every message matches
        embedder.send("delay 0")
        wait_embedder_reachable(serve)


# --- Postgres -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restart_mid_sweep_stalls_keys_and_the_next_sweep_completes(
    restartable_pg, restartable_db, tmp_path, mode
):
    """`fast`: a clean restart; `immediate`: a crash of the database mid-sweep."""
    url = restartable_db
    windows = seed_sessions(url, ["org-a", "org-b"], channels=3, sessions=3, messages=3)
    embedder = FakeModel("embedder")
    serve = serve_for(url, embedder, tmp_path)
    with running(embedder, serve):
        embedder.start()
        serve.start()
        embedder.send("hold")
        running_sweep = start_dwsearch("sweep", "--server-addr", serve.address)
        embedder.wait_for("embed ")  # keys locked, windows embedding: their connections die now
        restartable_pg.restart(mode)
        embedder.send("release")
        first = finish(running_sweep)
        assert first.code in (EXIT_OK, EXIT_ALL_STALLED), first
        assert first.summary["stalled"] >= 1 and "database" in first.err, first
        check_sweep_consistency(url)  # each window committed with its watermark, or not at all

        sweep_until_clean(serve)
        check_exactly_once(url, windows)
        check_sweep_consistency(url)


def test_postgres_restart_mid_search_and_mid_upsert_is_unavailable_then_recovers(
    restartable_pg, restartable_db, tmp_path
):
    url = restartable_db
    seed_sessions(url, ["org-a"], channels=2, sessions=2, messages=3)
    embedder = FakeModel("embedder")
    serve = serve_for(url, embedder, tmp_path)
    with (
        running(embedder, serve),
        grpc.insecure_channel(serve.address) as channel,
        ThreadPoolExecutor(1) as pool,
    ):
        embedder.start()
        serve.start()
        assert sweep(serve).code == EXIT_OK
        search_stub = search_pb2_grpc.SearchServiceStub(channel)
        index_stub = index_pb2_grpc.IndexServiceStub(channel)
        request = search_pb2.SearchRequest(org_id="org-a", query="parcel refund")
        assert len(search_stub.Search(request, timeout=60).hits) == 4

        # A search in flight (its query embedding held) when the database restarts.
        embedder.send("hold")
        calls = embedder.calls()
        # A query not searched before: a repeated one is answered from serve's query cache.
        fresh = search_pb2.SearchRequest(org_id="org-a", query="parcel refund status")
        in_flight = pool.submit(search_stub.Search, fresh, timeout=60)
        embedder.wait_for("embed ", count=calls + 1)  # the search is waiting for its query vector
        restartable_pg.restart()
        embedder.send("release")
        with pytest.raises(grpc.RpcError) as error:
            in_flight.result(timeout=60)
        assert error.value.code() == UNAVAILABLE and "database" in error.value.details()
        failures, response = calls_until_ok(lambda: search_stub.Search(request, timeout=60), POOL_MAX + 2)
        print(f"\nafter the restart, {failures} more search(es) failed before the pool recovered")
        assert failures <= POOL_MAX and len(response.hits) == 4
        for _ in range(5):  # recovered: every call succeeds again
            assert len(search_stub.Search(request, timeout=60).hits) == 4

        # An upsert of 20 documents in flight when the database restarts: all or nothing.
        documents = [
            index_pb2.Document(
                id=f"d{i}", data=f"knowledge article {i} about refunds", metadata=to_struct({"n": i})
            )
            for i in range(20)
        ]
        upsert = index_pb2.UpsertRequest(namespace="kb", documents=documents)
        before = fingerprint(url)
        embedder.send("hold")
        calls = embedder.calls()
        in_flight = pool.submit(index_stub.Upsert, upsert, timeout=60)
        embedder.wait_for("embed ", count=calls + 1)
        restartable_pg.restart()
        embedder.send("release")
        with pytest.raises(grpc.RpcError) as error:
            in_flight.result(timeout=60)
        assert error.value.code() == UNAVAILABLE
        assert fingerprint(url) == before  # nothing half-written
        failures, response = calls_until_ok(lambda: index_stub.Upsert(upsert, timeout=60), POOL_MAX + 2)
        assert failures <= POOL_MAX and response.upserted == 20
        page = index_stub.Range(index_pb2.RangeRequest(namespace="kb"), timeout=60)
        assert sorted(d.id for d in page.documents) == sorted(d.id for d in documents)


# --- the reranker ---------------------------------------------------------------------


def test_reranker_down_or_slow_degrades_with_the_reason_and_recovers(db_url, tmp_path):
    seed_sessions(db_url, ["org-a"], channels=3, sessions=1, messages=3)
    embedder = FakeModel("embedder")
    reranker = FakeModel("reranker")
    serve = Serve(db_url, embedder.address, tmp_path / "serve.log", reranker_addr=reranker.address,
                  env={"DWSEARCH_EMBED_TIMEOUT_MS": "10000", "DWSEARCH_RERANK_TIMEOUT_MS": "500"})  # fmt: skip
    with running(embedder, reranker, serve), grpc.insecure_channel(serve.address) as channel:
        embedder.start()
        reranker.start()
        serve.start()
        index = index_pb2_grpc.IndexServiceStub(channel)
        index.Upsert(index_pb2.UpsertRequest(namespace="kb", documents=[
            index_pb2.Document(id=f"k{i}", data=f"refund policy part {i}",
                               metadata=to_struct({"appId": "app", "type": "knowledge"})) for i in range(3)
        ]), timeout=60)  # fmt: skip

        def context() -> index_pb2.BuildAgentContextResponse:
            return index.BuildAgentContext(
                index_pb2.BuildAgentContextRequest(
                    namespace="kb", message="refund", app_id="app", rerank=True
                ),
                timeout=60,
            )

        reranked = search(serve, rerank=True)
        assert reranked.reranked and not reranked.degraded and len(reranked.hits) == 9
        assert context().reranked

        reranker.kill()
        down = search(serve, rerank=True)
        assert not down.reranked and down.degraded and len(down.hits) == 9
        assert [d.reason for d in down.degradations] == [search_pb2.DEGRADATION_REASON_RERANKER_UNAVAILABLE]
        assert {h.id for h in down.hits} == {h.id for h in reranked.hits}  # the fused order, not an error
        ctx = context()
        assert not ctx.reranked and [d.reason for d in ctx.degradations] == [
            search_pb2.DEGRADATION_REASON_RERANKER_UNAVAILABLE
        ]

        reranker.restart()
        wait_until(
            lambda: search(serve, rerank=True).reranked, 30, "the server to reach the reranker again", 0.2
        )

        reranker.send("delay 30")
        slow = search(serve, rerank=True)
        assert not slow.reranked and [d.reason for d in slow.degradations] == [
            search_pb2.DEGRADATION_REASON_RERANKER_TIMEOUT
        ]


# --- concurrent sweeps and shutdown ---------------------------------------------------


def test_two_replicas_sweeping_at_once_embed_each_window_exactly_once(db_url, tmp_path):
    windows = seed_sessions(db_url, ["org-a", "org-b"], channels=4, sessions=3, messages=3)
    embedder = FakeModel("embedder", None, "--delay", "0.05")  # long enough for the sweeps to overlap
    one = serve_for(db_url, embedder, tmp_path, "one")
    two = serve_for(db_url, embedder, tmp_path, "two")
    with running(embedder, one, two):
        embedder.start()
        one.start(wait=False)
        two.start()
        one.wait_serving()
        procs = [start_dwsearch("sweep", "--server-addr", s.address) for s in (one, two)]
        a, b = (finish(p) for p in procs)
        assert a.code == b.code == EXIT_OK, (a, b)
        assert a.summary["stalled"] == b.summary["stalled"] == 0
        assert a.summary["embedded"] + b.summary["embedded"] == 24
        assert a.summary["locked"] + b.summary["locked"] > 0 or 0 in (
            a.summary["embedded"],
            b.summary["embedded"],
        )
        assert max(Counter(embedder.embedded_inputs()).values()) == 1  # no window sent to the model twice
        check_exactly_once(db_url, windows)
        check_sweep_consistency(db_url)


def test_sigterm_or_kill_mid_sweep_leaves_every_window_whole(db_url, tmp_path):
    """Cut one backfill three times — SIGTERM with a grace period shorter than what is in
    flight, SIGKILL, and SIGTERM with a grace period long enough to drain the sweep — and
    check after each that every window was committed with its watermark or not at all;
    then that the backfill completes exactly once."""
    windows = seed_sessions(
        db_url, ["org-a", "org-b", "org-c"], channels=8, sessions=3, messages=3
    )  # 24 keys
    embedder = FakeModel("embedder", None, "--delay", "0.2")
    with running(embedder):
        embedder.start()

        # SIGTERM, 1 s grace, while Embed calls hang: the sweep is cancelled mid-flight.
        serve = serve_for(db_url, embedder, tmp_path, "term", DWSEARCH_GRACE_SECONDS="1").start()
        with running(serve):
            proc = start_dwsearch("sweep", "--server-addr", serve.address)
            embedder.wait_for("embed ", count=3)
            embedder.send("hold")
            serve.signal(signal.SIGTERM)
            assert serve.proc.wait(30) == 0
            cut = finish(proc)
            assert cut.code == EXIT_FAILED, cut  # the call ended without its summary
        check_sweep_consistency(db_url)
        after_term = len(embedded_windows(db_url))
        assert after_term < 72  # cut mid-sweep: the held calls never came back

        # SIGKILL: no drain at all; Postgres rolls back whatever transaction was open.
        embedder.send("release")
        serve = serve_for(db_url, embedder, tmp_path, "kill").start()
        with running(serve):
            proc = start_dwsearch("sweep", "--server-addr", serve.address)
            embedder.wait_for("embed ", count=embedder.calls() + 3)
            serve.proc.kill()
            serve.proc.wait(10)
            assert finish(proc).code == EXIT_FAILED
        check_sweep_consistency(db_url)
        after_kill = len(embedded_windows(db_url))
        assert after_term <= after_kill < 72

        # SIGTERM with time to drain: the sweep in flight runs to its summary.
        serve = serve_for(db_url, embedder, tmp_path, "drain", DWSEARCH_GRACE_SECONDS="60").start()
        with running(serve):
            proc = start_dwsearch("sweep", "--server-addr", serve.address)
            embedder.wait_for("embed ", count=embedder.calls() + 1)
            serve.signal(signal.SIGTERM)
            drained = finish(proc)
            assert serve.proc.wait(60) == 0
            assert drained.code == EXIT_OK and drained.summary["embedded"] > 0, drained
        check_sweep_consistency(db_url)

        serve = serve_for(db_url, embedder, tmp_path, "last").start()
        with running(serve):
            sweep_until_clean(serve)
        check_exactly_once(db_url, windows)
        check_sweep_consistency(db_url)
