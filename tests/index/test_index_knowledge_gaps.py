"""Knowledge gaps (dwsearch.index.gaps) over real gRPC and Postgres: recorded only for an
opted-in org and only under the threshold, redacted, in the background (a broken or slow
write never touches the answer), purged at the retention cutoff, forgotten, listed
grouped by similarity per org, every bad request INVALID_ARGUMENT, and `dwsearch gaps`."""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
import numpy as np
import psycopg
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import REGISTRY

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.common.config import ClientConfig, ServerConfig
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.common.rpcpolicy import Scope
from dwsearch.flags import KNOWLEDGE_GAPS_FLAG
from dwsearch.index import gaps as gaps_module
from dwsearch.index import gapstore
from dwsearch.index.commands import EXIT_FAILED, EXIT_OK, EXIT_USAGE, run_gaps_command
from dwsearch.index.context import AgentContextBuilder
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.filter import parse_filter
from dwsearch.index.gaps import GAP_CLUSTER_SIMILARITY, KnowledgeGaps, group_gaps, knowledge_org
from dwsearch.index.gapstore import GapRow, NewGap
from dwsearch.index.service import SERVICE_NAME, IndexService, to_struct
from dwsearch.redaction import Redaction, redact
from dwsearch.serve import build_application, method_policies
from dwsearch.sweep.admin import SweepAdmin
from dwsearch.sweep.commands import parse_cutoff
from dwsearch.v1 import index_pb2 as pb
from dwsearch.v1 import index_pb2_grpc
from dwsearch_testkit.fakes import FAKE_MODEL, fake_vector
from dwsearch_testkit.seed import set_org_flag

THRESHOLD = 0.5
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
INVALID = grpc.StatusCode.INVALID_ARGUMENT

# Questions and articles of a topic share one axis (plus a little noise of their own text):
# same topic, cosine about 0.97; another topic or none, about 0.
TOPICS = ("refund", "parcel", "password", "subscription")


def topic_vector(text: str, dimension: int) -> np.ndarray:
    base = np.zeros(dimension, dtype=np.float32)
    for axis, topic in enumerate(TOPICS):
        if topic in text.lower():
            base[axis] = 1.0
            break
    else:
        return fake_vector(text, dimension)
    vector = base + 0.15 * fake_vector(text, dimension)
    return vector / np.linalg.norm(vector)


def doc(doc_id: str, data: str, **metadata) -> pb.Document:
    return pb.Document(id=doc_id, data=data, metadata=to_struct(metadata))


SHOP = [
    doc("k-refund-1", "how refunds work", type="knowledge", appId="shop"),
    doc("k-refund-2", "refund timelines", type="knowledge", appId="shop"),
    doc("k-care", "caring for your blender", type="knowledge", appId="shop"),
    doc("t-parcel", "my parcel is late", type="conversation", appId="shop", resolution="refund"),
    # Another app's article answers parcels: it must not count for shop.
    doc("o-parcel", "where is my parcel", type="knowledge", appId="other"),
]
GAP_QUESTION = "where is my parcel?"  # shop has no parcel article
ANSWERED = "how long does a refund take?"


@dataclass
class Gapped:
    stub: index_pb2_grpc.IndexServiceStub
    gaps: KnowledgeGaps
    index: DocumentIndex
    address: str
    clock: list[datetime]

    def client_config(self) -> ClientConfig:
        return ClientConfig(server_addr=self.address, timeout_seconds=30)


@pytest.fixture
async def make_gapped(pool, fake_embedder) -> AsyncIterator[Callable[..., object]]:
    """make(redact=True) -> Gapped: an IndexService recording knowledge gaps, its flag read
    on every observation (flag_ttl 0), its clock settable."""
    fake_embedder.vector_fn = topic_vector
    closers = []
    hosts: list[GrpcHost] = []

    async def make(*, redact: bool = True) -> Gapped:
        embedder = EmbedderClient(fake_embedder.address, timeout=5)
        index = DocumentIndex(pool, embedder, model=FAKE_MODEL, redaction=Redaction(enabled=redact))
        clock = [T0]
        gaps = KnowledgeGaps(index, threshold=THRESHOLD, clock=lambda: clock[0], flag_ttl=0)
        service = IndexService(index, AgentContextBuilder(index, None, rerank_timeout=2, gaps=gaps), gaps)
        host = GrpcHost(
            "127.0.0.1:0",
            [Service(SERVICE_NAME, lambda s: index_pb2_grpc.add_IndexServiceServicer_to_server(service, s))],
        )
        port = await host.start()
        await host.set_serving(True)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        hosts.append(host)
        closers.extend([gaps.drain, embedder.close, channel.close])
        stub = index_pb2_grpc.IndexServiceStub(channel)
        await stub.Upsert(pb.UpsertRequest(documents=SHOP))
        return Gapped(stub, gaps, index, f"127.0.0.1:{port}", clock)

    yield make
    for close in closers:
        await close()
    for host in hosts:
        await host.stop(0)


@pytest.fixture
async def gapped(make_gapped, db_url) -> Gapped:
    set_org_flag(db_url, "shop", KNOWLEDGE_GAPS_FLAG, True)
    return await make_gapped()


def stored(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            "SELECT org_id, query, best_score, candidate_ids, created_at FROM dw_knowledge_gaps"
            " ORDER BY created_at, query"
        ).fetchall()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def context(g: Gapped, message: str, app_id: str = "shop", **fields) -> pb.BuildAgentContextResponse:
    response = await g.stub.BuildAgentContext(
        pb.BuildAgentContextRequest(message=message, app_id=app_id, **fields)
    )
    await g.gaps.drain()
    return response


# --- recording ------------------------------------------------------------------------------


async def test_a_gap_is_recorded_only_when_the_org_opted_in_and_under_the_threshold(make_gapped, db_url):
    g = await make_gapped()
    await context(g, GAP_QUESTION)
    assert stored(db_url) == []  # not opted in
    set_org_flag(db_url, "shop", KNOWLEDGE_GAPS_FLAG, True)
    response = await context(g, ANSWERED)
    assert {d.id for d in response.knowledge[:2]} == {"k-refund-1", "k-refund-2"}
    assert stored(db_url) == []  # answered: the best article scores about 0.97
    g.clock[0] = T0 + timedelta(minutes=5)
    response = await context(g, GAP_QUESTION)
    assert len(response.knowledge) == 3  # the answer is the same as ever
    ((org, question, best, candidates, at),) = stored(db_url)
    assert (org, question, at) == ("shop", GAP_QUESTION, T0 + timedelta(minutes=5))
    assert best is not None and best < THRESHOLD
    assert sorted(candidates) == ["k-care", "k-refund-1", "k-refund-2"]  # shop's, never other's
    set_org_flag(db_url, "shop", KNOWLEDGE_GAPS_FLAG, False)
    await context(g, GAP_QUESTION)
    assert len(stored(db_url)) == 1  # opted out again


async def test_the_best_score_is_dense_whatever_the_answer_fused_or_reranked(gapped, db_url):
    """The section's own scores are RRF here (the fake model has sparse vectors): a gap is
    judged by the dense similarity, so the same question is a gap or not whatever the mode."""
    response = await context(gapped, GAP_QUESTION)
    assert response.knowledge[0].score < 0.05  # RRF: no scale to hold a threshold against
    ((_, _, best, _, _),) = stored(db_url)
    assert -1 <= best < THRESHOLD


async def test_an_app_without_knowledge_records_a_gap_without_a_score(gapped, db_url):
    set_org_flag(db_url, "bare", KNOWLEDGE_GAPS_FLAG, True)
    await context(gapped, ANSWERED, app_id="bare")
    assert [(org, best, candidates) for org, _, best, candidates, _ in stored(db_url)] == [("bare", None, [])]


async def test_an_app_id_no_purge_could_name_is_never_recorded(gapped, db_url):
    long_app = "a" * 300  # a valid app id (512 bytes), over an org id's 256
    set_org_flag(db_url, long_app, KNOWLEDGE_GAPS_FLAG, True)
    await context(gapped, GAP_QUESTION, app_id=long_app)
    assert stored(db_url) == []


@pytest.mark.parametrize("redact_setting", [True, False])
async def test_the_stored_question_is_redacted_as_index_writes_are(make_gapped, db_url, redact_setting):
    """With the request's known names, exactly as an upsert redacts (DWSEARCH_REDACT off
    included: nothing unredacted is ever stored)."""
    set_org_flag(db_url, "shop", KNOWLEDGE_GAPS_FLAG, True)
    g = await make_gapped(redact=redact_setting)
    message = "Hi, Siti Aminah here, where is my parcel? mail siti@example.com or call +60 12-345 6789"
    await context(g, message, known_names=["Siti Aminah"])
    ((_, question, _, _, _),) = stored(db_url)
    assert question == redact(message, ["Siti Aminah"])
    assert "[NAME]" in question and "[EMAIL]" in question and "[PHONE]" in question
    with psycopg.connect(db_url) as conn:
        (row,) = conn.execute("SELECT t::text FROM dw_knowledge_gaps AS t").fetchone() or ("",)
    for secret in ("Siti", "Aminah", "siti@example.com", "345 6789"):
        assert secret not in row


async def test_a_knowledge_query_by_text_is_observed_too(gapped, db_url):
    knowledge = "appId = 'shop' AND type = 'knowledge'"
    await gapped.stub.Query(pb.QueryRequest(data="my parcel never came", filter=knowledge))
    await gapped.stub.Query(
        pb.QueryRequest(
            data="parcel lost", filter=f"category = 'x' AND {knowledge}", mode=pb.QUERY_MODE_DENSE
        )
    )
    # Not the knowledge section, not by text, or answered: nothing.
    await gapped.stub.Query(
        pb.QueryRequest(data="parcel again", filter="appId = 'shop' AND type = 'conversation'")
    )
    await gapped.stub.Query(pb.QueryRequest(data="parcel again", filter="type = 'knowledge'"))
    await gapped.stub.Query(pb.QueryRequest(vector=pb.DenseVector(values=[0.1] * 32), filter=knowledge))
    await gapped.stub.Query(pb.QueryRequest(data="refund please", filter=knowledge))
    await gapped.gaps.drain()
    assert [(org, q) for org, q, _, _, _ in stored(db_url)] == [
        ("shop", "my parcel never came"),
        ("shop", "parcel lost"),
    ]
    by_question = {q: b for _, q, b, _, _ in stored(db_url)}
    assert by_question["my parcel never came"] < THRESHOLD
    assert by_question["parcel lost"] is None  # no knowledge article has category 'x'


def test_knowledge_org_reads_a_knowledge_section_filter():
    cases = {
        "appId = 'shop' AND type = 'knowledge'": "shop",
        "type = 'knowledge' AND appId = 'it''s'": "it's",
        "appId = 'shop' AND (type = 'knowledge' AND category = 'x')": "shop",
        "appId = 'shop' AND type = 'conversation'": None,
        "appId = 'shop' OR type = 'knowledge'": None,
        "type = 'knowledge'": None,
        "appId = 'a' AND appId = 'b' AND type = 'knowledge'": None,
        "appId != 'shop' AND type = 'knowledge'": None,
        "": None,
    }
    assert {text: knowledge_org(parse_filter(text)) for text in cases} == cases


# --- never in the answer's way -----------------------------------------------------------------


async def test_a_broken_write_is_logged_and_counted_and_the_answer_still_returned(
    gapped, db_url, monkeypatch, caplog
):
    async def broken(conn, gap):
        raise psycopg.OperationalError("the disk is on fire")

    monkeypatch.setattr(gapstore, "record", broken)
    failures = sample("dwsearch_knowledge_gap_failures_total", reason="error")
    response = await context(gapped, GAP_QUESTION)
    assert len(response.knowledge) == 3 and not response.degraded
    assert sample("dwsearch_knowledge_gap_failures_total", reason="error") == failures + 1
    assert any(
        r.getMessage() == "knowledge gap not recorded" and "disk is on fire" in getattr(r, "error", "")
        for r in caplog.records
    )
    assert stored(db_url) == []


async def test_a_slow_write_never_delays_the_answer(gapped, db_url, monkeypatch):
    release = asyncio.Event()
    real = gapstore.record

    async def held(conn, gap):  # the write cannot finish before the answer is back
        await release.wait()
        await real(conn, gap)

    monkeypatch.setattr(gapstore, "record", held)
    response = await asyncio.wait_for(
        gapped.stub.BuildAgentContext(pb.BuildAgentContextRequest(message=GAP_QUESTION, app_id="shop")), 30
    )
    assert len(response.knowledge) == 3
    assert stored(db_url) == []  # the answer came while the write still waits
    release.set()
    await gapped.gaps.drain()
    assert len(stored(db_url)) == 1


async def test_beyond_the_waiting_cap_an_observation_is_dropped_and_counted(gapped, db_url, monkeypatch):
    release = asyncio.Event()
    real = gapstore.record

    async def held(conn, gap):
        await release.wait()
        await real(conn, gap)

    monkeypatch.setattr(gapstore, "record", held)
    monkeypatch.setattr(gaps_module, "MAX_PENDING_GAPS", 1)
    busy = sample("dwsearch_knowledge_gap_failures_total", reason="busy")
    for _ in range(3):
        await gapped.stub.BuildAgentContext(pb.BuildAgentContextRequest(message=GAP_QUESTION, app_id="shop"))
    assert sample("dwsearch_knowledge_gap_failures_total", reason="busy") == busy + 2
    release.set()
    await gapped.gaps.drain()
    assert len(stored(db_url)) == 1


# --- retention and deletion --------------------------------------------------------------------


async def test_purge_deletes_the_orgs_gaps_before_the_cutoff(gapped, db_url, pool):
    set_org_flag(db_url, "other", KNOWLEDGE_GAPS_FLAG, True)
    for days, app in [(40, "shop"), (31, "shop"), (29, "shop"), (40, "other")]:
        gapped.clock[0] = T0 - timedelta(days=days)
        await context(gapped, f"subscription {days} days ago", app_id=app)
    cutoff = T0 - timedelta(days=30)
    await SweepAdmin(pool, model=FAKE_MODEL, clock=lambda: T0).purge("shop", cutoff)
    assert [(org, q) for org, q, _, _, _ in stored(db_url)] == [
        ("other", "subscription 40 days ago"),
        ("shop", "subscription 29 days ago"),
    ]
    # A later Purge with an older cutoff relaxes nothing; at the very cutoff a gap stays.
    gapped.clock[0] = cutoff
    await context(gapped, "parcel at the cutoff")
    await SweepAdmin(pool, model=FAKE_MODEL, clock=lambda: T0).purge("shop", cutoff - timedelta(days=5))
    assert {q for org, q, _, _, _ in stored(db_url) if org == "shop"} == {
        "subscription 29 days ago",
        "parcel at the cutoff",
    }


async def test_forget_deletes_the_named_gaps_or_all_of_one_org(gapped, db_url):
    set_org_flag(db_url, "other", KNOWLEDGE_GAPS_FLAG, True)
    for question in ("parcel one", "parcel two", "parcel three"):
        await context(gapped, question)
    await context(gapped, "subscription elsewhere", app_id="other")
    listing = await gapped.stub.ListKnowledgeGaps(pb.ListKnowledgeGapsRequest(org_id="shop"))
    ids = [i for group in listing.groups for i in group.gap_ids]
    assert len(ids) == 3
    other_ids = [
        i
        for group in (await gapped.stub.ListKnowledgeGaps(pb.ListKnowledgeGapsRequest(org_id="other"))).groups
        for i in group.gap_ids
    ]
    # Another org's ids are ignored, repeats count once.
    done = await gapped.stub.ForgetKnowledgeGaps(
        pb.ForgetKnowledgeGapsRequest(org_id="shop", ids=[ids[0], ids[0], *other_ids])
    )
    assert done.deleted == 1
    assert await gapped.stub.ForgetKnowledgeGaps(
        pb.ForgetKnowledgeGapsRequest(org_id="shop", ids=[ids[0]])
    ) == (pb.ForgetKnowledgeGapsResponse(deleted=0))
    done = await gapped.stub.ForgetKnowledgeGaps(pb.ForgetKnowledgeGapsRequest(org_id="shop", all=True))
    assert done.deleted == 2
    assert [(org, q) for org, q, _, _, _ in stored(db_url)] == [("other", "subscription elsewhere")]


# --- listing -----------------------------------------------------------------------------------


async def record(g: Gapped, org: str, question: str, at: datetime, best: float | None = 0.2) -> None:
    async with g.index.pool.connection() as conn:
        await gapstore.record(conn, NewGap(org, question, best, [f"k-{question[:6]}"], at))


async def test_gaps_are_listed_grouped_by_similarity_most_frequent_first(gapped):
    minute = timedelta(minutes=1)
    gapped.clock[0] = T0 + 60 * minute
    for i, (question, best) in enumerate(
        [
            ("where is my parcel", 0.30),
            ("where is my parcel", 0.25),  # the same question again
            ("my parcel has not arrived", 0.40),
            ("parcel still missing after a week", None),
            ("how do I reset my password", 0.10),
            ("forgot password, reset please", 0.20),
            ("cancel my subscription", None),  # the app had no knowledge article
        ]
    ):
        await record(gapped, "shop", question, T0 + i * minute, best)
    response = await gapped.stub.ListKnowledgeGaps(pb.ListKnowledgeGapsRequest(org_id="shop"))
    assert (response.gaps, response.truncated) == (7, False)
    assert response.similarity == pytest.approx(GAP_CLUSTER_SIMILARITY)
    summary = [(g.query, g.count, list(g.examples)) for g in response.groups]
    assert summary == [
        ("where is my parcel", 4, ["parcel still missing after a week", "my parcel has not arrived"]),
        ("forgot password, reset please", 2, ["how do I reset my password"]),
        ("cancel my subscription", 1, []),
    ]
    parcel = response.groups[0]
    assert parcel.first_seen.ToDatetime(tzinfo=UTC) == T0
    assert parcel.last_seen.ToDatetime(tzinfo=UTC) == T0 + 3 * minute
    assert parcel.best_score == pytest.approx(0.40)
    assert list(parcel.candidate_ids) == ["k-parcel"]  # the latest gap's
    assert len(set(parcel.gap_ids)) == 4
    assert not response.groups[2].HasField("best_score")
    # The limit and the time range.
    response = await gapped.stub.ListKnowledgeGaps(pb.ListKnowledgeGapsRequest(org_id="shop", limit=1))
    assert [g.query for g in response.groups] == ["where is my parcel"]
    since = Timestamp()
    since.FromDatetime(T0 + 4 * minute)
    response = await gapped.stub.ListKnowledgeGaps(pb.ListKnowledgeGapsRequest(org_id="shop", since=since))
    assert sorted((g.query, g.count) for g in response.groups) == [
        ("cancel my subscription", 1),
        ("forgot password, reset please", 2),
    ]


async def test_one_orgs_gaps_are_never_listed_for_another(gapped):
    await record(gapped, "shop", "where is my parcel", T0)
    await record(gapped, "other", "where is my parcel", T0)
    await record(gapped, "other", "cancel my subscription", T0)
    await record(gapped, "shop'--", "cancel my subscription", T0)
    for org, expected in [
        ("shop", [("where is my parcel", 1)]),
        ("other", [("where is my parcel", 1), ("cancel my subscription", 1)]),
        ("shop'--", [("cancel my subscription", 1)]),
        ("nobody", []),
    ]:
        response = await gapped.stub.ListKnowledgeGaps(pb.ListKnowledgeGapsRequest(org_id=org))
        assert sorted((g.query, g.count) for g in response.groups) == sorted(expected), org
        assert response.gaps == len(expected)


def test_grouping_is_greedy_from_the_most_frequent_question():
    def row(question: str, minutes: int) -> GapRow:
        return GapRow(uuid.uuid4(), question, None, [], T0 + timedelta(minutes=minutes))

    # c (asked as often as a, more recently) starts the first group, a (unlike c) the
    # second; b, similar to both, joins the nearer first question, a's.
    a, c = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    b = np.array([0.8, 0.6])
    vectors = {"a": a, "b": b, "c": c}
    rows = [row("c", 5), row("b", 4), row("a", 3), row("a", 2), row("c", 1)]
    groups = group_gaps(rows, vectors, 0.55)
    assert [(g.query, g.count, g.examples) for g in groups] == [("a", 3, ["b"]), ("c", 2, [])]
    assert group_gaps([], {}, 0.85) == []
    # Above the similarity nothing joins.
    assert [g.count for g in group_gaps(rows, vectors, 0.99)] == [2, 2, 1]


async def test_too_many_gaps_are_cut_to_the_most_recent(gapped, monkeypatch):
    monkeypatch.setattr(gaps_module, "MAX_LISTED_GAPS", 3)
    for i in range(5):
        await record(gapped, "shop", f"question {i}", T0 + timedelta(minutes=i))
    response = await gapped.stub.ListKnowledgeGaps(pb.ListKnowledgeGapsRequest(org_id="shop"))
    assert (response.gaps, response.truncated) == (3, True)
    assert sorted(g.query for g in response.groups) == ["question 2", "question 3", "question 4"]


# --- bad requests ------------------------------------------------------------------------------


def _stamp(seconds: int) -> Timestamp:
    return Timestamp(seconds=seconds)


BAD = [
    ("List", pb.ListKnowledgeGapsRequest(), "org_id: required"),
    ("List", pb.ListKnowledgeGapsRequest(org_id="  "), "org_id: required"),
    ("List", pb.ListKnowledgeGapsRequest(org_id="é" * 129), "org_id: 258 bytes; the limit is 256"),
    ("List", pb.ListKnowledgeGapsRequest(org_id="a\x00b"), "org_id: NUL character"),
    (
        "List",
        pb.ListKnowledgeGapsRequest(org_id="shop", limit=101),
        "limit: 101; 1 to 100 allowed (0 means 20)",
    ),
    (
        "List",
        pb.ListKnowledgeGapsRequest(org_id="shop", since=_stamp(int(T0.timestamp()) + 60)),
        "is in the future",
    ),
    ("List", pb.ListKnowledgeGapsRequest(org_id="shop", since=_stamp(10**12)), "since: seconds"),
    ("Forget", pb.ForgetKnowledgeGapsRequest(org_id="shop"), "ids: required (or all)"),
    ("Forget", pb.ForgetKnowledgeGapsRequest(ids=[str(uuid.uuid4())]), "org_id: required"),
    (
        "Forget",
        pb.ForgetKnowledgeGapsRequest(org_id="shop", ids=[str(uuid.uuid4())], all=True),
        "ids and all: give one of them, not both",
    ),
    (
        "Forget",
        pb.ForgetKnowledgeGapsRequest(org_id="shop", ids=["nope"]),
        "ids: 'nope' is not a knowledge gap id",
    ),
    ("Forget", pb.ForgetKnowledgeGapsRequest(org_id="shop", ids=["x" * 65]), "the limit is 64"),
    (
        "Forget",
        pb.ForgetKnowledgeGapsRequest(org_id="shop", ids=[str(uuid.uuid4()) for _ in range(10_001)]),
        "10001 distinct ids; at most 10000",
    ),
]


@pytest.mark.parametrize("method,request_,needle", BAD, ids=[f"{m}: {n}" for m, _, n in BAD])
async def test_every_bad_request_is_invalid_argument_naming_the_problem(
    gapped, db_url, method, request_, needle
):
    await record(gapped, "shop", "where is my parcel", T0)
    call = gapped.stub.ListKnowledgeGaps if method == "List" else gapped.stub.ForgetKnowledgeGaps
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(request_)
    assert err.value.code() is INVALID, err.value.details()
    assert needle in err.value.details()
    assert len(stored(db_url)) == 1  # nothing deleted


async def test_without_gaps_configured_the_rpcs_say_so(make_stub):
    stub = await make_stub()  # tests/index/conftest.py: an IndexService without gaps
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListKnowledgeGaps(pb.ListKnowledgeGapsRequest(org_id="shop"))
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "knowledge gaps are not served" in err.value.details()


def test_the_gap_rpcs_need_an_admin_token():
    policies = method_policies(ServerConfig())
    for method in ("ListKnowledgeGaps", "ForgetKnowledgeGaps"):
        assert policies[f"/dwsearch.v1.IndexService/{method}"].scope is Scope.ADMIN


# --- the command -------------------------------------------------------------------------------


def gaps_args(**kw: object) -> argparse.Namespace:
    defaults = {"org_id": "shop", "since": "", "limit": 0, "json": False, "forget": None, "forget_all": False}
    return argparse.Namespace(**{**defaults, **kw})


async def run(g: Gapped, **kw: object) -> int:
    return await asyncio.to_thread(
        run_gaps_command, g.client_config(), gaps_args(**kw), parse_time=parse_cutoff
    )


async def test_the_gaps_command_lists_and_forgets(gapped, capsys):
    gapped.clock[0] = datetime.now(UTC)  # --since 7d is counted from now
    now = datetime.now(UTC).replace(microsecond=0)
    await record(gapped, "shop", "where is my parcel", now - timedelta(days=2), best=0.2)
    await record(gapped, "shop", "where is my parcel", now - timedelta(days=1), best=0.31)
    await record(gapped, "shop", "my parcel has not arrived", now - timedelta(hours=1), best=None)
    await record(gapped, "shop", "cancel my subscription", now - timedelta(days=10))
    assert await run(gapped, since="7d") == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["COUNT", "FIRST", "SEEN", "LAST", "SEEN", "BEST", "QUESTION"]
    assert out[1].split()[0] == "3" and out[1].endswith("0.31  where is my parcel")
    assert out[2].strip() == "~ my parcel has not arrived"
    assert out[3] == "1 group(s) of 3 gap(s); questions grouped at cosine >= 0.85"
    assert await run(gapped, json=True) == EXIT_OK
    assert '"query": "where is my parcel"' in capsys.readouterr().out

    assert await run(gapped, since="last tuesday") == EXIT_USAGE
    assert "gaps: --since: cutoff 'last tuesday' is neither" in capsys.readouterr().err
    assert await run(gapped, limit=101) == EXIT_FAILED  # the server refuses it
    assert "gaps failed: INVALID_ARGUMENT: limit: 101" in capsys.readouterr().err
    assert await run(gapped, org_id="") == EXIT_FAILED
    assert "INVALID_ARGUMENT: org_id: required" in capsys.readouterr().err
    assert await run(gapped, forget=["not-a-uuid"]) == EXIT_FAILED
    assert "INVALID_ARGUMENT: ids: 'not-a-uuid' is not a knowledge gap id" in capsys.readouterr().err
    assert await run(gapped, forget=["x"], forget_all=True) == EXIT_USAGE
    assert "--forget and --forget-all" in capsys.readouterr().err

    assert await run(gapped, forget_all=True) == EXIT_OK
    assert capsys.readouterr().out.strip() == "deleted 4 knowledge gap(s) of org shop"
    assert await run(gapped) == EXIT_OK
    assert capsys.readouterr().out.strip() == "0 group(s) of 0 gap(s); questions grouped at cosine >= 0.85"


def test_the_gaps_command_has_help():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "dwsearch.cli", "gaps", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "usage: dwsearch gaps" in result.stdout and "--org-id" in result.stdout
    assert "DWSEARCH_SERVER_ADDR" in result.stdout


# --- as `dwsearch serve` hosts it ----------------------------------------------------------------


async def test_serve_records_lists_and_purges_gaps(db_url, fake_embedder):
    """serve's composition: BuildAgentContext records (rerank asked for, no reranker: the
    answer degraded as ever), ListKnowledgeGaps lists, SweepService.Purge deletes."""
    from polling import until

    from dwsearch.db.pool import open_pool
    from dwsearch.v1 import sweep_pb2, sweep_pb2_grpc

    fake_embedder.vector_fn = topic_vector
    set_org_flag(db_url, "shop", KNOWLEDGE_GAPS_FLAG, True)
    config = ServerConfig(database_url=db_url, embed_model=FAKE_MODEL, embedder_addr=fake_embedder.address)
    pool = await open_pool(db_url, min_size=1, max_size=6)
    app = build_application(config=config, pool=pool, embedder=EmbedderClient(fake_embedder.address, timeout=10),
                      reranker=None)  # fmt: skip
    host = GrpcHost("127.0.0.1:0", list(app.services))
    port = await host.start()
    await host.set_serving(True)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        index = index_pb2_grpc.IndexServiceStub(channel)
        await index.Upsert(pb.UpsertRequest(documents=SHOP))
        response = await index.BuildAgentContext(
            pb.BuildAgentContextRequest(message=GAP_QUESTION, app_id="shop", rerank=True)
        )
        assert response.degraded and len(response.knowledge) == 3
        await until(lambda: len(stored(db_url)) == 1, what="the gap recorded")
        listing = await index.ListKnowledgeGaps(pb.ListKnowledgeGapsRequest(org_id="shop"))
        assert [(g.query, g.count) for g in listing.groups] == [(GAP_QUESTION, 1)]
        cutoff = Timestamp()
        cutoff.FromDatetime(datetime.now(UTC))
        await sweep_pb2_grpc.SweepServiceStub(channel).Purge(
            sweep_pb2.PurgeRequest(org_id="shop", cutoff=cutoff)
        )
        assert stored(db_url) == []
    finally:
        await channel.close()
        await host.stop(0)
        await app.close()


async def test_serve_records_the_gaps_still_pending_before_it_closes(db_url, fake_embedder):
    """serve's stop (Application.close) waits for recordings in flight before the pool goes."""
    from dwsearch.db.pool import open_pool

    fake_embedder.vector_fn = topic_vector
    set_org_flag(db_url, "shop", KNOWLEDGE_GAPS_FLAG, True)
    config = ServerConfig(database_url=db_url, embed_model=FAKE_MODEL, embedder_addr=fake_embedder.address)
    pool = await open_pool(db_url, min_size=1, max_size=6)
    app = build_application(config=config, pool=pool, embedder=EmbedderClient(fake_embedder.address, timeout=10),
                      reranker=None)  # fmt: skip
    host = GrpcHost("127.0.0.1:0", list(app.services))
    port = await host.start()
    await host.set_serving(True)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        index = index_pb2_grpc.IndexServiceStub(channel)
        await index.Upsert(pb.UpsertRequest(documents=SHOP))
        await index.BuildAgentContext(pb.BuildAgentContextRequest(message=GAP_QUESTION, app_id="shop"))
    finally:
        await channel.close()
        await host.stop(0)
        await app.close()  # at once: the recording is still in flight
    assert len(stored(db_url)) == 1
