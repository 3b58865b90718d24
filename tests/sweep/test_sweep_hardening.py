"""Sweep hardening (issue 14): every Embed response's model is checked, sweeps per
server are capped, all sweeps together hold a bounded share of the pool, and an org of
only whitespace is refused by Purge and Forget."""

import asyncio
from datetime import timedelta

import grpc
import pytest
from sweep_harness import LATER, Harness

from dwsearch.common.errors import InvalidArgument
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.sweep.service import SERVICE_NAME, SweepService
from dwsearch.v1 import sweep_pb2 as pb
from dwsearch.v1 import sweep_pb2_grpc as pb_grpc
from dwsearch_testkit.cluster import ON_CLUSTER
from dwsearch_testkit.fakes import FAKE_MODEL

OTHER_MODEL = "fake/other-model-v2"


def chat(n: int, tag: str = "m") -> list[tuple[float, str]]:
    return [(i, f"{tag} message number {i} about the delivery") for i in range(n)]


async def test_an_embed_response_of_another_model_stalls_the_key_and_writes_nothing(harness: Harness):
    """Info names the configured model, the Embed responses another (a pod of the other
    model answered): the sweep asked Info once and stored those vectors."""
    for c in range(3):
        harness.insert(f"c{c}", chat(4, tag=f"c{c}"))

    async def another_pod_answers() -> None:
        harness.fake.model_id = OTHER_MODEL

    harness.fake.on_embed = another_pod_answers
    progress = await harness.sweep()
    assert progress.windows_embedded == 0 and harness.embedded() == [] and harness.finished() == {}
    assert progress.keys_stalled == 3
    for stalled in progress.stalled:
        assert stalled.error.startswith("FAILED_PRECONDITION: ") and "answered with model" in stalled.error
        assert OTHER_MODEL in stalled.error and FAKE_MODEL in stalled.error
    # An outage of the right model, not the window's fault: nothing counted, nothing poison.
    assert [harness.watermark(f"c{c}")[1] for c in range(3)] == [0, 0, 0]

    harness.fake.on_embed = None
    harness.fake.model_id = FAKE_MODEL
    progress = await harness.sweep()
    assert progress.keys_stalled == 0 and set(harness.embedded()) == await harness.expected()


async def test_all_sweeps_together_hold_at_most_max_connections(harness: Harness):
    for c in range(6):
        harness.insert(f"c{c}", chat(3, tag=f"c{c}"))
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        held.set()
        await release.wait()

    harness.fake.on_embed = hold
    sweeper = harness.sweeper(max_connections=2)  # 4 keys at a time per sweep otherwise
    sweeps = [asyncio.ensure_future(_run(sweeper)) for _ in range(2)]
    await asyncio.wait_for(held.wait(), 10)
    for _ in range(100):  # until every connection slot is held by a key waiting on the model
        if _key_locks(harness) >= 2:
            break
        await asyncio.sleep(0.05)
    # A negative check, so time itself must pass: the other workers get 0.3 s to take a
    # third connection (they would within milliseconds), and none may.
    await asyncio.sleep(0.3)
    assert _key_locks(harness) == 2  # of the 8 workers of the two sweeps
    release.set()
    results = await asyncio.gather(*sweeps)
    assert sum(p.windows_embedded for p in results) == 6
    assert set(harness.embedded()) == await harness.expected()


async def _run(sweeper):
    from sweep_harness import sweep_once

    return await sweep_once(sweeper)


def _key_locks(harness: Harness) -> int:
    """Key locks held: session advisory locks on one node, lease rows on a cluster."""
    if ON_CLUSTER:
        (count,) = harness.query("SELECT count(*) FROM dw_sweep_key_leases")[0]
    else:
        (count,) = harness.query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")[0]
    return count


async def test_sweeps_over_the_cap_are_resource_exhausted_before_touching_the_database(harness: Harness):
    harness.insert("c1", chat(3))
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        held.set()
        await release.wait()

    harness.fake.on_embed = hold
    servicer = SweepService(harness.sweeper(), harness.admin(), max_concurrent=1)
    host = GrpcHost(
        "127.0.0.1:0",
        [Service(SERVICE_NAME, lambda s: pb_grpc.add_SweepServiceServicer_to_server(servicer, s))],
    )
    await host.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            stub = pb_grpc.SweepServiceStub(channel)
            first = asyncio.ensure_future(_collect(stub))
            await asyncio.wait_for(held.wait(), 10)
            for _ in range(5):
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await _collect(stub)
                assert error.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "DWSEARCH_MAX_CONCURRENT_SWEEPS=1" in error.value.details()
            assert servicer.running == 1
            release.set()
            assert (await first)[-1].windows_embedded == 1
            assert servicer.running == 0
            harness.insert("c2", chat(3))
            assert (await _collect(stub))[-1].windows_embedded == 1  # the slot is free again
            # A cancelled sweep gives its slot back too.
            release.clear()
            harness.insert("c3", chat(3))
            held.clear()
            cancelled = stub.Sweep(pb.SweepRequest(), timeout=30)
            await asyncio.wait_for(held.wait(), 10)
            cancelled.cancel()
            for _ in range(100):
                if servicer.running == 0:
                    break
                await asyncio.sleep(0.05)
            assert servicer.running == 0
            release.set()
    finally:
        await host.stop(0)


async def _collect(stub: pb_grpc.SweepServiceStub) -> list[pb.SweepResponse]:
    return [r async for r in stub.Sweep(pb.SweepRequest(), timeout=30)]


@pytest.mark.parametrize("org", ["", " ", "\t\n "])
async def test_purge_and_forget_refuse_an_org_of_only_whitespace(harness: Harness, org: str):
    admin = harness.admin()
    with pytest.raises(InvalidArgument, match="org_id"):
        await admin.purge(org, LATER - timedelta(days=1))
    with pytest.raises(InvalidArgument, match="org_id"):
        await admin.forget(org, ["00000000-0000-0000-0000-000000000000"])
    assert harness.query("SELECT count(*) FROM dw_sweep_retention")[0][0] == 0
