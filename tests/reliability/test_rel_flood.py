"""Memory floods against a real `dwsearch serve` process: large requests without a valid
token (or with one of too narrow a scope) are refused before their message is read, so
16 concurrent maximum-size ones leave serve's resident memory within 256 MiB of where it
was (they took it from 82 MiB to 1,251 MiB, above the pod's 1 GiB limit, when the token was
checked after the message was read); a message over its method's limit is dropped
unparsed; 200 Searches with distinct 2 MiB org ids leave nothing behind.

Run alone to see the figures: `pytest -s tests/reliability/test_rel_flood.py`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from dwsearch.common.rpcpolicy import MAX_MESSAGE_BYTES
from dwsearch.v1 import search_pb2, search_pb2_grpc
from dwsearch_testkit.net import free_port
from dwsearch_testkit.procs import Serve, running

MIB = 2**20
FLOOD_CALLS = 16
# The largest message serve's gRPC limit lets through (64 MiB, Upsert's): 60 MiB.
MAX_SIZE_BYTES = MAX_MESSAGE_BYTES - 4 * MIB
RSS_GROWTH_LIMIT = 256 * MIB
SEARCH_TOKEN = "search-tok-flood"
INDEX_TOKEN = "index-tok-flood"
ADMIN_TOKEN = "admin-tok-flood"
UPSERT = "/dwsearch.v1.IndexService/Upsert"


def _status_value(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def rss_bytes(pid: int) -> int:
    return _status_value(pid, "VmRSS")


@contextmanager
def peak_rss(pid: int):
    """Yields a dict that holds, on exit, serve's RSS before and its peak during the block:
    the kernel's high-water mark, reset first where /proc/PID/clear_refs allows (Linux
    4.0+), and RSS sampled every 5 ms besides."""
    before = rss_bytes(pid)
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    figures = {"before": before, "peak": before}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                figures["peak"] = max(figures["peak"], rss_bytes(pid))
            except (OSError, AssertionError):
                return
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield figures
    finally:
        stop.set()
        sampler.join()
        if reset:
            figures["peak"] = max(figures["peak"], _status_value(pid, "VmHWM"))
        figures["growth"] = figures["peak"] - before


async def _flood(
    address: str, method: str, payload: bytes, metadata: tuple, calls: int
) -> list[grpc.StatusCode]:
    """`calls` concurrent calls of `method` with `payload` as the message, each on a
    connection of its own (an attacker's many clients)."""

    async def one(i: int) -> grpc.StatusCode:
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", -1)]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            stub = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                await stub(payload, metadata=metadata, timeout=120)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    return list(await asyncio.gather(*(one(i) for i in range(calls))))


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _report(what: str, figures: dict[str, int]) -> str:
    line = (
        f"{what}: serve RSS {figures['before'] / MIB:.0f} MiB before, peak {figures['peak'] / MIB:.0f} MiB "
        f"({figures['growth'] / MIB:+.0f} MiB)"
    )
    print(line)
    return line


@pytest.fixture
def serve(db_url: str, tmp_path: Path):
    """serve with scoped tokens, on 127.0.0.1; no embedder (full-text search needs none)."""
    process = Serve(
        db_url,
        f"127.0.0.1:{free_port()}",
        tmp_path / "serve.log",
        env={
            "DWSEARCH_SEARCH_TOKENS": SEARCH_TOKEN,
            "DWSEARCH_INDEX_TOKENS": INDEX_TOKEN,
            "DWSEARCH_ADMIN_TOKENS": ADMIN_TOKEN,
        },
    )
    with running(process):
        process.start()
        yield process


async def _warm_up(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = search_pb2_grpc.SearchServiceStub(channel)
        for _ in range(5):
            await stub.Search(
                search_pb2.SearchRequest(org_id="org-a", query="refund", mode=search_pb2.SEARCH_MODE_FTS),
                metadata=_bearer(SEARCH_TOKEN), timeout=30,
            )  # fmt: skip
        codes = await _flood(address, UPSERT, b"x" * MIB, (), 2)
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 2


async def test_sixteen_maximum_size_unauthenticated_requests_leave_memory_flat(serve):
    assert serve.proc is not None
    await _warm_up(serve.address)
    payload = b"\x0a" * MAX_SIZE_BYTES
    figures_by_case: list[tuple[str, Callable[[], tuple]]] = [
        ("no token", lambda: ()),
        ("a wrong token", lambda: _bearer("not-a-token")),
        ("a search token (Upsert needs the index-write scope)", lambda: _bearer(SEARCH_TOKEN)),
    ]
    expected = {
        "no token": grpc.StatusCode.UNAUTHENTICATED,
        "a wrong token": grpc.StatusCode.UNAUTHENTICATED,
        "a search token (Upsert needs the index-write scope)": grpc.StatusCode.PERMISSION_DENIED,
    }
    lines = []
    for what, metadata in figures_by_case:
        with peak_rss(serve.proc.pid) as figures:
            started = time.monotonic()
            codes = await _flood(serve.address, UPSERT, payload, metadata(), FLOOD_CALLS)
            elapsed = time.monotonic() - started
        lines.append(_report(f"{FLOOD_CALLS} x {MAX_SIZE_BYTES / MIB:.0f} MiB Upserts with {what} ({elapsed:.1f} s)",
                             figures))  # fmt: skip
        assert codes == [expected[what]] * FLOOD_CALLS, what
        assert figures["growth"] < RSS_GROWTH_LIMIT, lines[-1]
    assert serve.proc.poll() is None


async def test_a_message_over_its_method_limit_is_refused_and_distinct_huge_org_ids_leave_nothing(serve):
    """Search takes at most 64 KiB: a 2 MiB org id is refused unparsed (RESOURCE_EXHAUSTED);
    one over 256 bytes is INVALID_ARGUMENT naming the field. 200 such Searches, each with
    a distinct org id, left 409-442 MiB resident in the flag and event-count caches
    before; now RSS ends within 32 MiB of where it started."""
    assert serve.proc is not None
    await _warm_up(serve.address)
    async with grpc.aio.insecure_channel(serve.address) as channel:
        stub = search_pb2_grpc.SearchServiceStub(channel)
        codes: dict[str, set[grpc.StatusCode]] = {"2 MiB": set(), "257 B": set()}
        with peak_rss(serve.proc.pid) as figures:
            for i in range(200):
                for what, size in (("2 MiB", 2 * MIB), ("257 B", 257)):
                    org_id = f"{i:05d}-" + "o" * (size - 6)
                    try:
                        await stub.Search(
                            search_pb2.SearchRequest(org_id=org_id, query="refund"),
                            metadata=_bearer(SEARCH_TOKEN), timeout=30,
                        )  # fmt: skip
                        codes[what].add(grpc.StatusCode.OK)
                    except grpc.aio.AioRpcError as exc:
                        codes[what].add(exc.code())
                        if what == "257 B":
                            assert "org_id" in exc.details() and "256" in exc.details(), exc.details()
                        else:
                            assert "takes at most 65536" in exc.details(), exc.details()
            # The longest org id allowed is served.
            await stub.Search(
                search_pb2.SearchRequest(org_id="o" * 256, query="refund", mode=search_pb2.SEARCH_MODE_FTS),
                metadata=_bearer(SEARCH_TOKEN), timeout=30,
            )  # fmt: skip
        after = rss_bytes(serve.proc.pid)
    _report("200 Searches with distinct 2 MiB org ids and 200 with 257-byte ones", figures)
    assert codes == {
        "2 MiB": {grpc.StatusCode.RESOURCE_EXHAUSTED},
        "257 B": {grpc.StatusCode.INVALID_ARGUMENT},
    }
    assert after - figures["before"] < 32 * MIB, (figures, after)
