"""SweepService over real gRPC (served in-process on 127.0.0.1:0) and the `dwsearch sweep`
/ `dwsearch purge` commands against it."""

import argparse
import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import grpc
import psycopg
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from polling import until
from prometheus_client import REGISTRY
from sweep_harness import ORG, T0, Harness, sweep_once

from dwsearch.common.config import ClientConfig, ServerConfig
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.db.pool import open_pool
from dwsearch.flags import MODULE_FLAG, SEMANTIC_SEARCH_FLAG, disabled_reasons, orgs_with_events
from dwsearch.serve import build_application
from dwsearch.sweep.admin import SweepAdmin
from dwsearch.sweep.commands import (
    EXIT_ALL_STALLED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNHEALTHY,
    EXIT_USAGE,
    parse_cutoff,
    run_forget_command,
    run_purge_command,
    run_retry_poison_command,
    run_status_command,
    run_sweep_command,
)
from dwsearch.sweep.forget import MAX_FORGET_IDS
from dwsearch.sweep.service import SERVICE_NAME, SweepService
from dwsearch.v1 import sweep_pb2 as pb
from dwsearch.v1 import sweep_pb2_grpc as pb_grpc
from dwsearch_testkit.cluster import WAITING_STATEMENT, through_a_worker
from dwsearch_testkit.fakes import FAKE_MODEL, Failure
from dwsearch_testkit.seed import enable_semantic_search, set_org_flag


def chat(n: int, start: float = 0, tag: str = "m") -> list[tuple[float, str]]:
    return [(start + i, f"{tag} message number {i} about the delivery") for i in range(n)]


class Server:
    def __init__(self, host: GrpcHost) -> None:
        self.host = host
        self.address = f"127.0.0.1:{host.port}"
        self.channel = grpc.aio.insecure_channel(self.address)
        self.stub = pb_grpc.SweepServiceStub(self.channel)
        self.servicer: SweepService | None = None

    def client_config(self) -> ClientConfig:
        return ClientConfig(server_addr=self.address, timeout_seconds=30)


async def serve(service: Service) -> AsyncIterator[Server]:
    host = GrpcHost("127.0.0.1:0", [service])
    await host.start()
    await host.set_serving(True)
    server = Server(host)
    try:
        yield server
    finally:
        await server.channel.close()
        await host.stop(0)


@pytest.fixture
async def server(harness: Harness) -> AsyncIterator[Server]:
    """SweepService over the harness's database; on a cluster its Status, Purge, Forget and
    RetryPoison connect to a worker while sweeps connect to the coordinator, so that the
    retention locks are tested across nodes."""
    admin_pool = await open_pool(through_a_worker(harness.url), min_size=1, max_size=4)
    servicer = SweepService(harness.sweeper(), SweepAdmin(admin_pool, model=FAKE_MODEL, clock=harness.clock))
    try:
        async for s in serve(
            Service(SERVICE_NAME, lambda srv: pb_grpc.add_SweepServiceServicer_to_server(servicer, srv))
        ):
            s.servicer = servicer
            yield s
    finally:
        await admin_pool.close()


def sweep_args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(
        **{"org_id": "", "max_windows": 0, "max_duration": 0.0, "progress": False, **kw}
    )


async def test_sweep_streams_cumulative_progress_and_ends_with_the_summary(harness: Harness, server: Server):
    for c in range(3):
        harness.insert(f"c{c}", chat(20, tag=f"c{c}"))
    responses = [r async for r in server.stub.Sweep(pb.SweepRequest())]
    assert [r.done for r in responses] == [False] * (len(responses) - 1) + [True]
    assert responses[0].events_pending == 60 and responses[0].keys_total == 3  # the backlog comes first
    processed = [r.events_processed for r in responses]
    assert processed == sorted(processed)
    last = responses[-1]
    assert (last.windows_embedded, last.keys_done, last.events_processed, last.model) == (
        6,
        3,
        60,
        FAKE_MODEL,
    )
    assert last.elapsed.ToTimedelta() > timedelta(0)


async def test_budget_over_grpc(harness: Harness, server: Server):
    harness.insert("c1", chat(40))
    responses = [r async for r in server.stub.Sweep(pb.SweepRequest(max_windows=1))]
    assert responses[-1].budget_exhausted and responses[-1].windows_embedded == 1
    request = pb.SweepRequest()
    request.max_duration.FromTimedelta(timedelta(seconds=-1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        [r async for r in server.stub.Sweep(request)]
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_a_deadline_mid_sweep_leaves_no_half_window_and_no_held_lock(harness: Harness, server: Server):
    for c in range(4):
        harness.insert(f"c{c}", chat(15 * 15, tag=f"c{c}"))  # 15 windows each: two Embed calls or more
    calls = []
    release = asyncio.Event()

    async def second_call_hangs() -> None:
        calls.append(1)
        if len(calls) > 1:
            await release.wait()

    harness.fake.on_embed = second_call_hangs
    with pytest.raises(grpc.aio.AioRpcError) as err:
        [r async for r in server.stub.Sweep(pb.SweepRequest(), timeout=1.5)]
    assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    servicer = server.servicer
    assert servicer is not None
    # The server side unwinds: the windows in flight roll back, the key locks are released.
    await until(lambda: servicer.running == 0, what="the cancelled sweep to unwind")
    assert 0 < len(harness.embedded()) < 60
    release.set()
    harness.fake.on_embed = None
    progress = await harness.sweep()
    assert (progress.keys_locked, progress.keys_stalled) == (0, 0)
    embedded = harness.embedded()
    assert len(embedded) == len(set(embedded)) == 60 and set(embedded) == await harness.expected()


async def test_model_mismatch_is_failed_precondition(harness: Harness, server: Server):
    harness.insert("c1", chat(2))
    harness.fake.model_id = "BAAI/bge-m3"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        [r async for r in server.stub.Sweep(pb.SweepRequest())]
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "BAAI/bge-m3" in err.value.details() and FAKE_MODEL in err.value.details()


async def test_status_purge_and_retry_poison(harness: Harness, server: Server):
    bad = harness.insert("c1", chat(2, tag="bad"))
    harness.insert("c2", chat(2, start=100))
    harness.fake.fail_texts[
        "bad message number 0 about the delivery\nbad message number 1 about the delivery"
    ] = Failure(grpc.StatusCode.INVALID_ARGUMENT, "unembeddable")
    await harness.sweep()
    harness.insert("c2", chat(1, start=150))
    harness.insert("c3", chat(2, start=200))  # not swept yet: no watermark

    status = await server.stub.Status(pb.StatusRequest(org_id=ORG))
    assert status.model == FAKE_MODEL and status.embedded_windows == 1
    marks = {w.external_channel_id: w for w in status.watermarks}
    assert marks["c1"].last_event_id == bad[-1] and marks["c1"].pending_events == 0
    assert marks["c2"].pending_events == 1 and marks["c2"].lag.ToTimedelta() > timedelta(0)
    assert status.pending_events == 1 + 2  # c2's new message and c3's unswept ones
    assert status.unswept_events == 2 and status.unswept_lag.ToTimedelta() > timedelta(days=1)  # c3
    (poison,) = status.poison_windows
    assert list(poison.source_message_ids) == bad and "unembeddable" in poison.error

    released = await server.stub.RetryPoison(pb.RetryPoisonRequest(org_id=ORG, ids=[poison.id]))
    assert released.windows_released == 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.RetryPoison(pb.RetryPoisonRequest(ids=["not-a-uuid"]))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    cutoff = Timestamp()
    cutoff.FromDatetime(T0 + timedelta(minutes=120))
    purged = await server.stub.Purge(pb.PurgeRequest(org_id=ORG, cutoff=cutoff))
    assert purged.embeddings_deleted == 1
    for request in (pb.PurgeRequest(org_id=ORG), pb.PurgeRequest(cutoff=cutoff)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await server.stub.Purge(request)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_sweep_command_prints_a_summary(harness: Harness, server: Server, capsys):
    ids = harness.insert("c1", chat(3))
    code = await asyncio.to_thread(
        run_sweep_command, server.client_config(), sweep_args(org_id=ORG, progress=True)
    )
    out, err = capsys.readouterr()
    assert code == EXIT_OK
    assert "1 windows embedded" in out and "3 of 3 pending events" in out
    assert "sweep" in err  # the progress bar
    assert "dropped" not in out

    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (ids[0],))
    code = await asyncio.to_thread(run_sweep_command, server.client_config(), sweep_args(org_id=ORG))
    out, _ = capsys.readouterr()
    assert code == EXIT_OK
    assert "1 windows dropped (an event in them was deleted, edited or became ineligible)" in out
    assert "1 windows embedded" in out  # the two messages left, windowed again


async def test_sweep_command_warns_on_stalled_keys_and_fails_when_all_stall(
    harness: Harness, server: Server, capsys
):
    harness.insert("c1", chat(2, tag="stuck"))
    harness.insert("c2", chat(2, tag="fine"))
    harness.fake.fail_texts[
        "stuck message number 0 about the delivery\nstuck message number 1 about the delivery"
    ] = Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
    assert await asyncio.to_thread(run_sweep_command, server.client_config(), sweep_args()) == EXIT_OK
    _, err = capsys.readouterr()
    assert "1 key(s) stalled" in err and f"{ORG}/whatsapp/c1" in err and "queue full" in err

    assert (
        await asyncio.to_thread(run_sweep_command, server.client_config(), sweep_args()) == EXIT_ALL_STALLED
    )


async def test_sweep_command_fails_on_an_rpc_error(harness: Harness, server: Server, capsys):
    harness.fake.model_id = "another/model"
    assert await asyncio.to_thread(run_sweep_command, server.client_config(), sweep_args()) == EXIT_FAILED
    assert "FAILED_PRECONDITION" in capsys.readouterr().err
    unreachable = ClientConfig(server_addr="127.0.0.1:1", timeout_seconds=2)
    assert await asyncio.to_thread(run_sweep_command, unreachable, sweep_args()) == EXIT_FAILED


async def test_purge_command(harness: Harness, server: Server, capsys):
    harness.insert("c1", chat(2))
    await harness.sweep()
    args = argparse.Namespace(org_id=ORG, cutoff=(T0 + timedelta(hours=1)).isoformat())
    assert await asyncio.to_thread(run_purge_command, server.client_config(), args) == EXIT_OK
    assert "1 embeddings" in capsys.readouterr().out
    bad = argparse.Namespace(org_id=ORG, cutoff="yesterday")
    assert await asyncio.to_thread(run_purge_command, server.client_config(), bad) == EXIT_USAGE


async def test_forget_drops_the_windows_holding_the_messages_at_once(harness: Harness, server: Server):
    edited = harness.insert("c1", chat(3, tag="edited"))
    other = harness.insert("c2", chat(2))
    theirs = harness.insert("c1", chat(2), org="org-b")
    enable_semantic_search(harness.url, "org-b")
    await harness.sweep()
    harness.query(
        "UPDATE dw_chat_events SET message_text = 'new words' WHERE id = %s RETURNING id", (edited[1],)
    )
    response = await server.stub.Forget(pb.ForgetRequest(org_id=ORG, message_ids=[edited[1], theirs[0]]))
    assert response.windows_dropped == 1  # org-b's message is not org-a's to forget
    assert harness.embedded() == [tuple(other)]
    assert harness.embedded(org="org-b") == [tuple(theirs)]
    progress = await harness.sweep()
    assert (progress.windows_dropped, progress.windows_embedded) == (0, 1)
    assert harness.embedded() == [tuple(edited), tuple(other)]
    (content,) = harness.query(
        "SELECT content FROM dw_message_embeddings WHERE source_message_ids[1] = %s", (edited[0],)
    )[0]
    assert "new words" in content
    # Nothing to drop: fine.
    assert (
        await server.stub.Forget(pb.ForgetRequest(org_id=ORG, message_ids=[theirs[1]]))
    ).windows_dropped == 0


@pytest.mark.parametrize("change", ["delete", "edit"])
async def test_forget_racing_a_window_write_leaves_no_old_text(harness: Harness, server: Server, change):
    """The message changes after the sweep's write checked it but before that write
    commits: Forget waits for the write, then drops it."""
    secret = harness.insert("c1", chat(2, tag="secret"))
    harness.insert("c0", chat(1))  # gives the org a watermark for the locker to hold back
    await harness.sweep(org_id=ORG)
    harness.query("DELETE FROM dw_message_embeddings WHERE content LIKE 'secret%%' RETURNING id")
    harness.query(
        "DELETE FROM dw_sweep_windows WHERE %s = ANY(source_message_ids) RETURNING id", (secret[0],)
    )
    async with await psycopg.AsyncConnection.connect(harness.url) as locker:
        # Hold c1's watermark row: finish_window stops at its upsert, after its checks.
        await locker.execute(
            "SELECT 1 FROM dw_sweep_watermarks WHERE org_id = %s AND external_channel_id = 'c1' FOR UPDATE",
            (ORG,),
        )
        sweep = asyncio.ensure_future(harness.sweep())
        for _ in range(200):
            if harness.query(WAITING_STATEMENT, ("%INSERT INTO dw_sweep_watermarks%",)):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the window write never reached the watermark")
        if change == "delete":
            harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (secret[0],))
        else:
            harness.query(
                "UPDATE dw_chat_events SET message_text = 'new words' WHERE id = %s RETURNING id",
                (secret[0],),
            )
        forget = asyncio.ensure_future(
            server.stub.Forget(pb.ForgetRequest(org_id=ORG, message_ids=[secret[0]]))
        )
        # Forget waits for the write in flight: its exclusive retention lock (FOR UPDATE
        # of the org's retention row) behind the write's shared one (FOR SHARE).
        await until(
            lambda: harness.query(WAITING_STATEMENT, ("%dw_sweep_retention%FOR UPDATE%",)),
            what="Forget to wait on the retention lock",
        )
        assert not forget.done()
        await locker.rollback()
    await sweep
    assert (await forget).windows_dropped == 1
    assert harness.query(
        "SELECT count(*) FROM dw_message_embeddings WHERE content LIKE 'secret message number 0%%'"
    ) == [(0,)]


async def test_forget_drops_every_models_windows_and_counts_them(harness: Harness, server: Server):
    ids = harness.insert("c1", chat(2))
    await harness.sweep()
    harness.fake.model_id = "fake/other"
    await sweep_once(harness.sweeper(model="fake/other"))
    harness.fake.model_id = FAKE_MODEL
    before = REGISTRY.get_sample_value("dwsearch_sweep_windows_dropped_total") or 0.0
    harness.query("DELETE FROM dw_chat_events WHERE id = %s RETURNING id", (ids[0],))
    response = await server.stub.Forget(pb.ForgetRequest(org_id=ORG, message_ids=[ids[0], ids[0].upper()]))
    assert response.windows_dropped == 2
    assert harness.embedded() == harness.embedded("fake/other") == []
    assert REGISTRY.get_sample_value("dwsearch_sweep_windows_dropped_total") == before + 2
    await harness.sweep()
    assert harness.embedded() == [(ids[1],)]


@pytest.mark.parametrize(
    "request_kwargs, needle",
    [
        ({"message_ids": ["7d0f1f2e-8f0c-4c36-9d3c-2a1d2f8e9b10"]}, "org_id"),
        ({"org_id": ORG}, "message_ids is required"),
        (
            {"org_id": ORG, "message_ids": ["7d0f1f2e-8f0c-4c36-9d3c-2a1d2f8e9b10", "42"]},
            "message_ids[1] = '42'",
        ),
        ({"org_id": ORG, "message_ids": [""]}, "message_ids[0] = ''"),
        (
            {"org_id": ORG, "message_ids": [str(uuid.UUID(int=i)) for i in range(MAX_FORGET_IDS + 1)]},
            "at most",
        ),
    ],
)
async def test_forget_rejects_bad_requests(server: Server, request_kwargs, needle):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.Forget(pb.ForgetRequest(**request_kwargs))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and needle in err.value.details()


async def test_forget_command(harness: Harness, server: Server, capsys):
    ids = harness.insert("c1", chat(2))
    await harness.sweep()
    args = argparse.Namespace(org_id=ORG, message_ids=[ids[0]])
    assert await asyncio.to_thread(run_forget_command, server.client_config(), args) == EXIT_OK
    assert "dropped 1 window(s)" in capsys.readouterr().out
    bad = argparse.Namespace(org_id=ORG, message_ids=["not-a-uuid"])
    assert await asyncio.to_thread(run_forget_command, server.client_config(), bad) == EXIT_USAGE
    assert "message_ids[0] = 'not-a-uuid'" in capsys.readouterr().err
    unknown = argparse.Namespace(org_id="", message_ids=[ids[0]])  # the server refuses it
    assert await asyncio.to_thread(run_forget_command, server.client_config(), unknown) == EXIT_FAILED
    assert "INVALID_ARGUMENT" in capsys.readouterr().err


def status_args(**kw: object) -> argparse.Namespace:
    defaults = {
        "org_id": "",
        "model": "",
        "all": False,
        "json": False,
        "max_lag": "",
        "fail_on_poison": False,
    }
    return argparse.Namespace(**{**defaults, **kw})


async def test_sweep_status_and_retry_poison_commands(harness: Harness, server: Server, capsys):
    harness.insert("c1", chat(2, tag="bad"))
    harness.insert("c2", chat(2, start=100))
    harness.fake.fail_texts[
        "bad message number 0 about the delivery\nbad message number 1 about the delivery"
    ] = Failure(grpc.StatusCode.INVALID_ARGUMENT, "unembeddable")
    await harness.sweep()
    harness.insert("c2", chat(1, start=150))  # behind: T0 + 150 min, long ago
    cfg = server.client_config()

    code = await asyncio.to_thread(run_status_command, cfg, status_args(org_id=ORG))
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert f"model {FAKE_MODEL}: 1 embedded windows, 1 pending events" in out and "1 poison windows" in out
    keys, poison = out.split("POISON WINDOW")
    (behind,) = [line.split() for line in keys.splitlines() if line.startswith(ORG)]  # c1 is caught up
    assert behind[:2] == [f"{ORG}/whatsapp/c2", "1"] and behind[2].endswith("h")  # lag like 27d3h
    assert f"{ORG}/whatsapp/c1" in poison and "unembeddable" in poison
    assert await asyncio.to_thread(run_status_command, cfg, status_args(all=True)) == EXIT_OK
    assert f"{ORG}/whatsapp/c1" in capsys.readouterr().out.split("POISON WINDOW")[0]

    assert await asyncio.to_thread(run_status_command, cfg, status_args(max_lag="1h")) == EXIT_UNHEALTHY
    assert "1 key(s) lag more than 1h" in capsys.readouterr().err
    assert await asyncio.to_thread(run_status_command, cfg, status_args(max_lag="3650d")) == EXIT_OK
    assert (
        await asyncio.to_thread(run_status_command, cfg, status_args(fail_on_poison=True)) == EXIT_UNHEALTHY
    )
    assert await asyncio.to_thread(run_status_command, cfg, status_args(max_lag="soon")) == EXIT_USAGE
    capsys.readouterr()
    assert await asyncio.to_thread(run_status_command, cfg, status_args(json=True)) == EXIT_OK
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == FAKE_MODEL and len(doc["poison_windows"]) == 1

    retry = argparse.Namespace(org_id=ORG, id=None)
    assert await asyncio.to_thread(run_retry_poison_command, cfg, retry) == EXIT_OK
    assert "released 1 poison window(s)" in capsys.readouterr().out
    bad_id = argparse.Namespace(org_id="", id=["not-a-uuid"])
    assert await asyncio.to_thread(run_retry_poison_command, cfg, bad_id) == EXIT_FAILED
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
    unreachable = ClientConfig(server_addr="127.0.0.1:1", timeout_seconds=2)
    assert await asyncio.to_thread(run_status_command, unreachable, status_args()) == EXIT_FAILED
    assert "UNAVAILABLE" in capsys.readouterr().err


async def test_sweep_status_sees_keys_no_sweep_has_reached(harness: Harness, server: Server, capsys):
    harness.insert("c9", chat(3))  # enabled org, never swept: no watermark
    cfg = server.client_config()
    assert await asyncio.to_thread(run_status_command, cfg, status_args(max_lag="1h")) == EXIT_UNHEALTHY
    out, err = capsys.readouterr()
    assert "3 of the pending events belong to keys no sweep has reached yet" in out
    assert "3 events of keys no sweep has reached" in err
    assert await asyncio.to_thread(run_status_command, cfg, status_args(json=True)) == EXIT_OK
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["unswept_events"] == "3" and doc["watermarks"] == [] and doc["embedded_windows"] == "0"


def test_parse_cutoff():
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    assert parse_cutoff("30d", now=now) == now - timedelta(days=30)
    assert parse_cutoff("12h", now=now) == now - timedelta(hours=12)
    assert parse_cutoff("2026-10-30T00:00:00Z", now=now) == datetime(2026, 10, 30, tzinfo=UTC)
    assert parse_cutoff("2026-10-30T08:00:00+08:00", now=now) == datetime(2026, 10, 30, tzinfo=UTC)
    assert parse_cutoff("2026-10-30", now=now) == datetime(2026, 10, 30, tzinfo=UTC)
    with pytest.raises(ValueError):
        parse_cutoff("soon", now=now)


async def test_serve_wiring_and_the_dwsearch_commands_as_processes(harness: Harness, db_url: str):
    """The SweepService as `dwsearch serve` builds it (build_application) (real clock, redaction on), driven
    by `dwsearch sweep` and `dwsearch purge` subprocesses."""
    now = datetime.now(UTC)
    minutes = (now - T0).total_seconds() / 60
    ids = harness.insert(
        "c1", [(minutes - 120, "mail me at ahmad@example.com about the refund"), (minutes - 119, "ok")]
    )
    config = ServerConfig(database_url=db_url, embed_model=FAKE_MODEL, embedder_addr=harness.fake.address)
    app = build_application(config=config, pool=harness.pool, embedder=harness.embedder, reranker=None)
    async for server in serve(app.service(SERVICE_NAME)):

        async def dwsearch(*argv: str, address: str = server.address) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dwsearch.cli", *argv, "--server-addr", address,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
            return proc.returncode or 0, out.decode(), err.decode()

        code, out, err = await dwsearch("sweep", "--org-id", ORG, "--progress")
        assert code == EXIT_OK, err
        assert "1 windows embedded" in out
        assert harness.embedded() == [tuple(ids)]
        (content,) = harness.query("SELECT content FROM dw_message_embeddings")[0]
        assert content == "mail me at [EMAIL] about the refund\nok"

        code, out, err = await dwsearch("purge", "--org-id", ORG, "--cutoff", "1h")
        assert code == EXIT_OK, err
        assert "1 embeddings" in out and harness.embedded() == []


# A sweep says per org why nothing ran: semantic search's flags are off (issue 16).


async def test_every_org_sweep_names_the_orgs_left_out_and_their_flags(harness: Harness):
    harness.insert("c1", chat(2))
    harness.insert("c1", chat(2), org="org-off")
    progress = await harness.sweep()
    assert progress.windows_embedded == 1
    assert progress.orgs_skipped == [
        ("org-off", f"org flag {MODULE_FLAG} is off; org flag {SEMANTIC_SEARCH_FLAG} is off")
    ]


async def test_one_org_sweep_names_the_admin_flag(harness: Harness):
    harness.insert("c1", chat(2))
    harness.query("UPDATE admin_feature_flags SET enabled = false RETURNING flag_key")
    progress = await harness.sweep(org_id=ORG)
    assert progress.keys_total == 0
    assert progress.orgs_skipped == [(ORG, f"admin flag {SEMANTIC_SEARCH_FLAG} is off")]


async def test_an_enabled_org_is_never_reported(harness: Harness):
    harness.insert("c1", chat(2))
    assert (await harness.sweep(org_id=ORG)).orgs_skipped == []
    assert (await harness.sweep()).orgs_skipped == []


async def test_orgs_with_events_skip_scans_and_is_bounded(harness: Harness):
    for org in ("o3", "o1", "o2"):
        harness.insert("c1", chat(3), org=org)
    async with harness.pool.connection() as conn:
        assert await orgs_with_events(conn) == sorted(["o1", "o2", "o3"])
        assert await orgs_with_events(conn, limit=2) == ["o1", "o2"]
        assert await disabled_reasons(conn, []) == {}


async def test_sweep_command_prints_why_nothing_ran(harness: Harness, server, capsys):
    harness.insert("c1", chat(2))
    set_org_flag(harness.url, ORG, MODULE_FLAG, False)
    code = await asyncio.to_thread(run_sweep_command, server.client_config(), sweep_args())
    out, _ = capsys.readouterr()
    assert code == EXIT_OK
    assert "0 windows embedded" in out
    assert f"org {ORG} not swept: semantic search is off (org flag {MODULE_FLAG} is off)" in out
    assert 'nothing to sweep: semantic search is off for these orgs; README "Feature flags"' in out


async def test_grpc_summary_carries_orgs_skipped(harness: Harness, server):
    harness.insert("c1", chat(2), org="org-off")
    summary = None
    async for p in server.stub.Sweep(pb.SweepRequest()):
        summary = p
    assert [(o.org_id, o.reason) for o in summary.orgs_skipped] == [
        ("org-off", f"org flag {MODULE_FLAG} is off; org flag {SEMANTIC_SEARCH_FLAG} is off")
    ]
