"""Hardening of issue 14 with real processes over loopback (`dwsearch serve`, the fake
embedder as processes, a Postgres of these tests' own): the right status when the
database is down before a sweep, a cap on concurrent sweeps that leaves the pool to
Search, and a pod of another model behind the round-robin embedder address never
getting its vectors stored."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import psycopg
import pytest
from polling import until

from dwsearch.v1 import index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc, sweep_pb2, sweep_pb2_grpc
from dwsearch_testkit.fakes import fake_vector
from dwsearch_testkit.procs import FakeModel, Serve, running
from dwsearch_testkit.reldb import check_exactly_once, check_sweep_consistency, seed_sessions

pytestmark = pytest.mark.slow

POOL_MAX = 4
FAKE_DIMENSION = 32
OTHER_MODEL = "fake/other-model-v2"


def serve_for(url: str, embedder_addr: str, tmp_path, name: str = "serve", **env: str) -> Serve:
    return Serve(
        url, embedder_addr, tmp_path / f"{name}.log",
        env={"DWSEARCH_DB_POOL_MAX": str(POOL_MAX), "DWSEARCH_EMBED_TIMEOUT_MS": "10000", **env},
    )  # fmt: skip


def sweep_rpc(serve: Serve, **fields: object) -> sweep_pb2.SweepResponse:
    """One Sweep call to its summary (raises grpc.RpcError)."""
    with grpc.insecure_channel(serve.address) as channel:
        responses = list(
            sweep_pb2_grpc.SweepServiceStub(channel).Sweep(sweep_pb2.SweepRequest(**fields), timeout=60)
        )
    assert responses and responses[-1].done
    return responses[-1]


def sweeps_until_clean(serve: Serve, attempts: int = POOL_MAX + 3) -> tuple[list[grpc.StatusCode], int]:
    """Sweep until one finishes with nothing stalled or locked; every failed call must be
    UNAVAILABLE (never INTERNAL). Returns the failures' codes and the calls made."""
    failures: list[grpc.StatusCode] = []
    for attempt in range(1, attempts + 1):
        try:
            summary = sweep_rpc(serve)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, (exc.code(), exc.details())
            failures.append(exc.code())
            continue
        if summary.keys_stalled == 0 and summary.keys_locked == 0:
            return failures, attempt
    raise AssertionError(f"no clean sweep in {attempts} attempts (failures: {failures})")


def test_postgres_down_before_a_sweep_is_unavailable_and_sweeps_recover_after_start_and_restart(
    restartable_pg, restartable_db, tmp_path
):
    """The sweep's first database step caught psycopg.errors.TransactionRollbackError,
    which psycopg 3.3 does not have: evaluating that clause raised, so every database
    error at a sweep's start answered INTERNAL."""
    url = restartable_db
    windows = seed_sessions(url, ["org-a"], channels=2, sessions=2, messages=3)
    embedder = FakeModel("embedder")
    serve = serve_for(url, embedder.address, tmp_path)
    with running(embedder, serve):
        embedder.start()
        serve.start()
        restartable_pg.stop()
        try:
            for _ in range(2):  # a pooled connection broken by the stop, then no connection at all
                with pytest.raises(grpc.RpcError) as error:
                    sweep_rpc(serve)
                assert error.value.code() == grpc.StatusCode.UNAVAILABLE, error.value.details()
                assert "database" in error.value.details()
        finally:
            restartable_pg.start()
        failures, calls = sweeps_until_clean(serve)
        print(f"\nafter the start: {len(failures)} sweep(s) UNAVAILABLE, clean at call {calls}")
        check_exactly_once(url, windows)

        # A restart while serve is idle: every pooled connection is broken.
        restartable_pg.restart()
        failures, calls = sweeps_until_clean(serve)
        print(f"after the restart: {len(failures)} sweep(s) UNAVAILABLE, clean at call {calls}")
        assert len(failures) <= POOL_MAX
        check_sweep_consistency(url)


async def test_concurrent_sweeps_are_capped_and_search_keeps_the_pool(db_url, tmp_path):
    """300 Sweep streams at once exhausted the pool (each sweep holds a connection per key
    it sweeps), and a concurrent Search failed UNAVAILABLE after the pool's 10 s. Now two
    run, the rest are refused at once, and all sweeps together hold half the pool (here
    60 streams: already far past what a pool of 4 held)."""
    windows = seed_sessions(db_url, ["org-a", "org-b"], channels=4, sessions=2, messages=3)  # 8 keys
    embedder = FakeModel("embedder")
    serve = serve_for(db_url, embedder.address, tmp_path, DWSEARCH_MAX_CONCURRENT_SWEEPS="2")
    with running(embedder, serve):
        embedder.start()
        serve.start()
        embedder.send("hold")  # admitted sweeps keep their keys' connections while they wait
        async with grpc.aio.insecure_channel(serve.address) as channel:
            stub = sweep_pb2_grpc.SweepServiceStub(channel)
            calls = [stub.Sweep(sweep_pb2.SweepRequest(), timeout=120) for _ in range(60)]

            async def first(call):
                try:
                    return await call.read()
                except grpc.aio.AioRpcError as exc:
                    return exc.code()

            # An admitted sweep may wait for a connection slot the other holds (its keys
            # wait on the held embedder): its first response comes after the release.
            firsts = [asyncio.ensure_future(first(c)) for c in calls]

            def refused() -> list[grpc.StatusCode]:
                return [f.result() for f in firsts if f.done() and isinstance(f.result(), grpc.StatusCode)]

            await until(lambda: len(refused()) >= len(calls) - 2, timeout=30, what="the refusals")
            assert len(refused()) == len(calls) - 2 and set(refused()) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            admitted = [(c, f) for c, f in zip(calls, firsts, strict=True)
                        if not (f.done() and isinstance(f.result(), grpc.StatusCode))]  # fmt: skip
            await asyncio.to_thread(embedder.wait_for, "embed ")  # keys locked, windows held at the model

            search = search_pb2_grpc.SearchServiceStub(channel)
            for query in ("parcel refund", "session message", "refund"):
                started = time.monotonic()
                response = await search.Search(
                    search_pb2.SearchRequest(org_id="org-a", query=query, mode=search_pb2.SEARCH_MODE_FTS),
                    timeout=30,
                )
                took = time.monotonic() - started
                assert response.hits and took < 5, (query, took)

            refused_now = stub.Sweep(sweep_pb2.SweepRequest(), timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await refused_now.read()
            assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "DWSEARCH_MAX_CONCURRENT_SWEEPS" in error.value.details()

            await asyncio.to_thread(embedder.send, "release")
            summaries = []
            for call, started_reading in admitted:
                last = await started_reading
                assert isinstance(last, sweep_pb2.SweepResponse), last
                while (response := await call.read()) is not grpc.aio.EOF:
                    last = response
                assert last.done
                summaries.append(last)
            # The two split the keys (key locks); each window once.
            assert sum(s.windows_embedded for s in summaries) == sum(len(w) for w in windows.values())
        check_exactly_once(db_url, windows)
        check_sweep_consistency(db_url)
        # A slot is free again once a sweep has finished.
        assert sweep_rpc(serve).done


def _halfvec(text: str) -> np.ndarray:
    return np.array([float(x) for x in text.strip("[]").split(",")], dtype=np.float32)


def assert_only_the_right_models_vectors(url: str) -> int:
    """Every stored vector (chat windows and index documents) is the configured model's
    for its stored text, not the other pod's; returns how many were checked."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT content, embedding::text FROM dw_message_embeddings").fetchall()
        rows += conn.execute("SELECT data, embedding::text FROM dw_index_documents").fetchall()
    for text, embedding in rows:
        stored = _halfvec(embedding)
        right = fake_vector(text, FAKE_DIMENSION)
        wrong = fake_vector(f"{OTHER_MODEL}\n{text}", FAKE_DIMENSION)
        assert np.allclose(stored, right, atol=2e-3), f"not the configured model's vector for {text[:40]!r}"
        assert not np.allclose(stored, wrong, atol=2e-3)
    return len(rows)


def test_a_pod_of_another_model_behind_round_robin_never_gets_its_vectors_stored(db_url, tmp_path):
    """Mid-rollout: two embedder pods of different models behind one round-robin address.
    The sweep asked Info once per sweep and ignored EmbedResponse.model_id, so windows
    embedded by the other pod were stored. Now every Embed response is checked: the
    sweep stalls the key (FAILED_PRECONDITION naming both models), Upsert answers
    FAILED_PRECONDITION, a search degrades; nothing of the other model is stored."""
    windows = seed_sessions(db_url, ["org-a", "org-b"], channels=3, sessions=2, messages=3)
    right = FakeModel("embedder")
    wrong = FakeModel("embedder", None, "--model-id", OTHER_MODEL)
    serve = serve_for(db_url, f"ipv4:{right.address},{wrong.address}", tmp_path)
    with running(right, wrong, serve), grpc.insecure_channel(serve.address) as channel:
        right.start()
        wrong.start()
        serve.start()
        errors: list[str] = []
        for _ in range(8):
            try:
                summary = sweep_rpc(serve)
            except grpc.RpcError as exc:  # Info reached the other pod: the whole sweep refuses
                assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc.details()
                errors.append(exc.details())
                continue
            errors += [s.error for s in summary.stalled]
            if wrong.calls() and any("answered with model" in e for e in errors):
                break
        assert wrong.calls() > 0, "no Embed call reached the other pod: the check was not exercised"
        refused = [e for e in errors if "answered with model" in e]
        assert refused and OTHER_MODEL in refused[0] and "FAILED_PRECONDITION" in refused[0], errors

        index = index_pb2_grpc.IndexServiceStub(channel)
        codes = []
        for i in range(6):
            try:
                index.Upsert(index_pb2.UpsertRequest(namespace="kb", documents=[
                    index_pb2.Document(id=f"d{i}", data=f"knowledge article {i} about refunds")]), timeout=60)  # fmt: skip
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc.details()
                codes.append(exc.code())
        assert grpc.StatusCode.FAILED_PRECONDITION in codes

        search = search_pb2_grpc.SearchServiceStub(channel)
        for i in range(6):  # distinct queries: a cached one would not reach the embedder
            response = search.Search(
                search_pb2.SearchRequest(org_id="org-a", query=f"parcel refund {i}"), timeout=60
            )
            for d in response.degradations:  # never an error: full text answers whichever pod was asked
                assert d.reason == search_pb2.DEGRADATION_REASON_EMBEDDER_UNAVAILABLE and "model" in d.detail
        checked = assert_only_the_right_models_vectors(db_url)
        check_sweep_consistency(db_url)

        # The rollout ends: the other pod goes away, the rest is embedded by the right one.
        wrong.stop()
        failures = 0
        for _ in range(POOL_MAX + 6):
            try:
                summary = sweep_rpc(serve)
            except grpc.RpcError as exc:
                assert exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)
                failures += 1
                continue
            if summary.keys_stalled == 0 and summary.keys_locked == 0:
                break
        check_exactly_once(db_url, windows)
        assert assert_only_the_right_models_vectors(db_url) > checked
