"""Every string field of serve's requests has a length limit, and every list a count limit
checked before any work: INVALID_ARGUMENT naming the field and the limit, nothing
written. A message over its method's own limit is RESOURCE_EXHAUSTED, unparsed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from dwsearch.v1 import index_pb2, search_pb2, sweep_pb2
from dwsearch_testkit.reldb import fingerprint

INVALID = grpc.StatusCode.INVALID_ARGUMENT
TOO_BIG = grpc.StatusCode.RESOURCE_EXHAUSTED


def _cutoff() -> Timestamp:
    ts = Timestamp()
    ts.FromSeconds(int(time.time()) - 86_400)
    return ts


def _over(limit: int) -> str:
    return "x" * (limit + 1)


# (what, call, the words the status message must hold)
CASES: list[tuple[str, Callable[[Any], Any], tuple[str, ...]]] = [
    ("Search org_id", lambda s: s.search.Search(search_pb2.SearchRequest(org_id=_over(256), query="q")), ("org_id", "256")),
    ("Search provider", lambda s: s.search.Search(
        search_pb2.SearchRequest(org_id="org-a", query="q", provider=_over(256))), ("provider", "256")),
    ("Search external_channel_id", lambda s: s.search.Search(
        search_pb2.SearchRequest(org_id="org-a", query="q", external_channel_id=_over(512))),
     ("external_channel_id", "512")),
    ("Sweep org_id", lambda s: _drain(s.sweep.Sweep(sweep_pb2.SweepRequest(org_id=_over(256)))), ("org_id", "256")),
    ("Status org_id", lambda s: s.sweep.Status(sweep_pb2.StatusRequest(org_id=_over(256))), ("org_id", "256")),
    ("Status model", lambda s: s.sweep.Status(sweep_pb2.StatusRequest(model=_over(256))), ("model", "256")),
    ("Purge org_id", lambda s: s.sweep.Purge(sweep_pb2.PurgeRequest(org_id=_over(256), cutoff=_cutoff())),
     ("org_id", "256")),
    ("Forget org_id", lambda s: s.sweep.Forget(
        sweep_pb2.ForgetRequest(org_id=_over(256), message_ids=[str(uuid.uuid4())])), ("org_id", "256")),
    ("Forget 10,001 distinct ids", lambda s: s.sweep.Forget(
        sweep_pb2.ForgetRequest(org_id="org-a", message_ids=[str(uuid.UUID(int=i)) for i in range(10_001)])),
     ("10001 distinct", "10000")),
    ("Forget a 65-character id", lambda s: s.sweep.Forget(
        sweep_pb2.ForgetRequest(org_id="org-a", message_ids=["f" * 65])), ("message_ids[0]",)),
    ("RetryPoison org_id", lambda s: s.sweep.RetryPoison(sweep_pb2.RetryPoisonRequest(org_id=_over(256))),
     ("org_id", "256")),
    ("RetryPoison 10,001 distinct ids", lambda s: s.sweep.RetryPoison(
        sweep_pb2.RetryPoisonRequest(ids=[str(uuid.UUID(int=i)) for i in range(10_001)])), ("10001 distinct", "10000")),
    ("RetryPoison a 65-character id", lambda s: s.sweep.RetryPoison(sweep_pb2.RetryPoisonRequest(ids=["f" * 65])),
     ("ids", "65 characters", "64")),
    ("Upsert 1,001 documents", lambda s: s.index.Upsert(index_pb2.UpsertRequest(
        namespace="ns", documents=[index_pb2.Document(id=f"d{i}", data="text") for i in range(1001)])),
     ("documents", "1001", "1000")),
    ("Upsert 1,001 known names", lambda s: s.index.Upsert(index_pb2.UpsertRequest(
        namespace="ns", documents=[index_pb2.Document(id="d", data="text")], known_names=["Ahmad"] * 1001)),
     ("known_names", "1000")),
    ("Upsert a 257-byte known name", lambda s: s.index.Upsert(index_pb2.UpsertRequest(
        namespace="ns", documents=[index_pb2.Document(id="d", data="text")], known_names=[_over(256)])),
     ("known_names[0]", "256")),
    ("Upsert namespace", lambda s: s.index.Upsert(index_pb2.UpsertRequest(
        namespace=_over(512), documents=[index_pb2.Document(id="d", data="text")])), ("namespace", "512")),
    ("Upsert id", lambda s: s.index.Upsert(index_pb2.UpsertRequest(
        namespace="ns", documents=[index_pb2.Document(id=_over(512), data="text")])), ("documents[0].id", "512")),
    ("Range cursor", lambda s: s.index.Range(index_pb2.RangeRequest(namespace="ns", cursor=_over(1024))),
     ("cursor", "1024")),
    ("Range prefix", lambda s: s.index.Range(index_pb2.RangeRequest(namespace="ns", prefix=_over(512))),
     ("prefix", "512")),
    ("Fetch 1,001 ids", lambda s: s.index.Fetch(index_pb2.FetchRequest(namespace="ns", ids=["a"] * 1001)),
     ("ids", "1000")),
    ("BuildAgentContext app_id", lambda s: s.index.BuildAgentContext(index_pb2.BuildAgentContextRequest(
        namespace="ns", message="refund", app_id=_over(512))), ("app_id", "512")),
]  # fmt: skip


async def _drain(call):
    return [r async for r in call]


async def _status(call: Callable[[Any], Any], stack: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call(stack)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def test_every_string_and_list_has_a_limit_checked_before_any_work(make_stack):
    stack = await make_stack()
    before = fingerprint(stack.url)
    wrong = []
    for what, call, words in CASES:
        code, details = await _status(call, stack)
        if code != INVALID or not all(word in details for word in words):
            wrong.append((what, code.name, details[:200]))
    assert wrong == []
    assert fingerprint(stack.url) == before


async def test_repeated_ids_are_dropped_before_they_are_counted_or_parsed(make_stack):
    """25,000 copies of one id fit the 1 MiB message limit of Forget and RetryPoison and
    count once; 1.5 million copies (57 MB: it froze serve for 3.3 s) are over it and
    refused unparsed."""
    stack = await make_stack()
    one = str(uuid.uuid4())
    started = time.monotonic()
    forgot = await stack.sweep.Forget(sweep_pb2.ForgetRequest(org_id="org-a", message_ids=[one] * 25_000))
    released = await stack.sweep.RetryPoison(sweep_pb2.RetryPoisonRequest(ids=[one] * 25_000))
    assert forgot.windows_dropped == 0 and released.windows_released == 0
    assert time.monotonic() - started < 5
    code, details = await _status(
        lambda s: s.sweep.Forget(sweep_pb2.ForgetRequest(org_id="org-a", message_ids=[one] * 1_500_000)),
        stack,
    )
    assert code == TOO_BIG and "takes at most 1048576" in details, details
