"""Tenancy and PII, as properties over random orgs, namespaces, filters and personal
data, through the gRPC services as `dwsearch serve` wires them (fake embedder, real
Postgres):

- a sweep never mixes orgs, channels or providers in a window, never writes for an org
  whose flags are off or outside the org it was asked to sweep; Status, Search and Purge
  never show or touch another org's rows (search's own property over seeded windows is
  tests/search/test_search.py::test_no_result_crosses_an_org);
- Update and BuildAgentContext never reach across namespaces (Query, Fetch, Range and
  Delete: tests/index/test_index_isolation.py);
- with redaction on, the embedder never receives, and the database never stores, an
  e-mail, card, NRIC, phone number or known name — from the sweep, search queries, index
  upserts, updates, queries or agent-context messages.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import grpc
import psycopg
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common.config import ServerConfig
from dwsearch.common.grpchost import GrpcHost
from dwsearch.db.pool import open_pool
from dwsearch.index.service import from_struct, to_struct
from dwsearch.redaction import NRIC_BIRTHPLACE_CODES, luhn_valid
from dwsearch.serve import build_application
from dwsearch.v1 import index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc, sweep_pb2, sweep_pb2_grpc
from dwsearch_testkit.fakes import FAKE_MODEL, FakeEmbedder, FakeReranker
from dwsearch_testkit.seed import enable_semantic_search, insert_events

PROPERTY = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
PROVIDERS = ["whatsapp", "telegram"]
ORGS = ["org-a", "org-b", "org-c", "org-d"]
SWEPT_TABLES = ("dw_chat_events, dw_message_embeddings, dw_sweep_windows, dw_sweep_window_events, "
                "dw_sweep_watermarks, dw_sweep_retention, dw_lexical_windows, dw_lexical_terms, "
                "org_feature_flags")  # fmt: skip


@dataclass
class Server:
    url: str
    fake: FakeEmbedder
    search: search_pb2_grpc.SearchServiceStub
    sweep: sweep_pb2_grpc.SweepServiceStub
    index: index_pb2_grpc.IndexServiceStub

    def reset(self) -> None:
        """A clean slate for the next example."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {SWEPT_TABLES}, dw_index_documents CASCADE")
        self.fake.received.clear()

    async def sweep_all(self, org_id: str = "") -> sweep_pb2.SweepResponse:
        responses = [r async for r in self.sweep.Sweep(sweep_pb2.SweepRequest(org_id=org_id), timeout=60)]
        return responses[-1]

    def rows(self, query: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(query, params).fetchall()


@pytest.fixture
async def server(db_url: str, fake_embedder: FakeEmbedder) -> AsyncIterator[Server]:
    """Search, Sweep and Index as `dwsearch serve` hosts them, redaction on."""
    reranker = FakeReranker()
    await reranker.start()
    config = ServerConfig(database_url=db_url, embed_model=FAKE_MODEL, embedder_addr=fake_embedder.address,
                          reranker_addr=reranker.address, embed_timeout_ms=10_000, redact=True)  # fmt: skip
    pool = await open_pool(db_url, min_size=1, max_size=6)
    app = build_application(config=config, pool=pool, embedder=EmbedderClient(fake_embedder.address, timeout=10),
                      reranker=RerankerClient(reranker.address, timeout=10))  # fmt: skip
    host = GrpcHost("127.0.0.1:0", list(app.services))
    port = await host.start()
    await host.set_serving(True)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Server(
            db_url,
            fake_embedder,
            search_pb2_grpc.SearchServiceStub(channel),
            sweep_pb2_grpc.SweepServiceStub(channel),
            index_pb2_grpc.IndexServiceStub(channel),
        )
    finally:
        await channel.close()
        await host.stop(0)
        await app.close()
        await reranker.stop()


# --- orgs: sweep, status, search, purge -------------------------------------------------

# A conversation: (org, provider, channel, messages, hours after the first one).
conversations = st.lists(
    st.tuples(
        st.sampled_from(ORGS),
        st.sampled_from(PROVIDERS),
        st.sampled_from(["c1", "c2"]),
        st.integers(min_value=1, max_value=4),
        st.integers(min_value=0, max_value=5),
    ),
    min_size=1,
    max_size=10,
)


@PROPERTY
@given(
    data=conversations,
    enabled=st.sets(st.sampled_from(ORGS)),
    scope=st.sampled_from(["", *ORGS]),
    asker=st.sampled_from(ORGS),
)
async def test_no_sweep_status_search_or_purge_crosses_an_org(server, data, enabled, scope, asker):
    server.reset()
    start = datetime.now(UTC) - timedelta(days=2)
    owner: dict[str, str] = {}
    for i, (org, provider, channel, n, hours) in enumerate(data):
        # Every org shares the words, so a leak would match.
        rows = [(org, provider, channel, f"refund parcel {org} conversation {i} line {m}",
                 start + timedelta(hours=hours, minutes=i * 5 + m)) for m in range(n)]  # fmt: skip
        for event_id in insert_events(server.url, rows):
            owner[event_id] = org
    if enabled:
        enable_semantic_search(server.url, *sorted(enabled))

    await server.sweep_all(scope)
    mixed = server.rows(
        """SELECT m.id FROM dw_message_embeddings m JOIN dw_chat_events e ON e.id::text = ANY(m.source_message_ids)
           WHERE e.org_id <> m.org_id OR e.provider <> m.provider OR e.external_channel_id <> m.external_channel_id"""
    )
    assert mixed == []  # a window is one org, one provider, one channel
    written = {org for (org,) in server.rows("SELECT DISTINCT org_id FROM dw_message_embeddings")}
    allowed = enabled if not scope else enabled & {scope}
    assert written <= allowed
    assert {org for (org,) in server.rows("SELECT DISTINCT org_id FROM dw_sweep_watermarks")} <= allowed

    status = await server.sweep.Status(sweep_pb2.StatusRequest(org_id=asker), timeout=30)
    assert {w.org_id for w in status.watermarks} <= {asker}
    assert all(p.org_id == asker for p in status.poison_windows)
    (own,) = server.rows("SELECT count(*) FROM dw_message_embeddings WHERE org_id = %s", (asker,))[0]
    assert status.embedded_windows == own

    response = await server.search.Search(search_pb2.SearchRequest(org_id=asker, query="refund parcel", limit=100),
                                          timeout=30)  # fmt: skip
    for hit in response.hits:
        assert {owner[m] for m in hit.message_ids} == {asker}

    others = server.rows("SELECT id FROM dw_message_embeddings WHERE org_id <> %s ORDER BY id", (asker,))
    cutoff = Timestamp()
    cutoff.FromDatetime(datetime.now(UTC))
    purged = await server.sweep.Purge(sweep_pb2.PurgeRequest(org_id=asker, cutoff=cutoff), timeout=30)
    assert purged.embeddings_deleted == own
    assert (
        server.rows("SELECT id FROM dw_message_embeddings WHERE org_id <> %s ORDER BY id", (asker,)) == others
    )


# --- namespaces: update and agent context ------------------------------------------------

namespaces = st.lists(
    st.sampled_from(["", "ns-1", "ns-2", "app/二", "x'y"]), min_size=2, max_size=3, unique=True
)
sections = st.sampled_from([
    {"type": "knowledge"},
    {"type": "conversation", "resolution": "refund"},
    {"type": "response", "trustScore": 0.9},
])  # fmt: skip


@PROPERTY
@given(names=namespaces, kinds=st.lists(sections, min_size=3, max_size=3), patch=st.dictionaries(
    st.sampled_from(["tag", "seen"]), st.sampled_from(["a", "b", 1.0]), min_size=1))  # fmt: skip
async def test_update_and_agent_context_stay_in_their_namespace(server, names, kinds, patch):
    server.reset()
    for name in names:
        documents = [
            index_pb2.Document(id=f"doc-{i}", data=f"refund help {i} from {name}",
                               metadata=to_struct({**kind, "appId": "app", "ns": name}))
            for i, kind in enumerate(kinds)
        ]  # fmt: skip
        await server.index.Upsert(index_pb2.UpsertRequest(namespace=name, documents=documents), timeout=30)
    target, *others = names
    before = {
        name: (await server.index.Fetch(index_pb2.FetchRequest(namespace=name, ids=["doc-0"], include_data=True,
                                                               include_metadata=True), timeout=30)).documents[0]
        for name in others
    }  # fmt: skip

    updated = await server.index.Update(index_pb2.UpdateRequest(
        namespace=target, id="doc-0", metadata=to_struct(patch), data="rewritten refund help"), timeout=30)  # fmt: skip
    assert updated.updated
    for name in others:
        after = await server.index.Fetch(index_pb2.FetchRequest(namespace=name, ids=["doc-0"], include_data=True,
                                                                include_metadata=True), timeout=30)  # fmt: skip
        assert after.documents[0] == before[name]
    missing = await server.index.Update(index_pb2.UpdateRequest(
        namespace="no-such-ns", id="doc-0", metadata=to_struct(patch)), timeout=30)  # fmt: skip
    assert not missing.updated

    for name in names:
        for rerank in (False, True):
            context = await server.index.BuildAgentContext(index_pb2.BuildAgentContextRequest(
                namespace=name, message="refund help", app_id="app", rerank=rerank), timeout=30)  # fmt: skip
            found = [*context.similar_tickets, *context.knowledge, *context.good_responses]
            assert found and all(from_struct(d.metadata)["ns"] == name for d in found)


# --- PII never reaches the embedder -----------------------------------------------------

NAMES = ["Siti Nurhaliza", "Tan Wei Ming", "陈伟", "Rajesh Kumar"]


def _card(prefix: str, body: str, separator: str) -> str:
    """A Luhn-valid 16-digit card number of a payment-card issuer, grouped by 4."""
    digits = (prefix + body)[:15]
    digits += next(d for d in "0123456789" if luhn_valid(digits + d))
    return separator.join(digits[i : i + 4] for i in range(0, 16, 4))


emails = st.from_regex(r"[a-z][a-z0-9._]{0,8}@[a-z]{2,8}\.(com|my|org|com\.my)", fullmatch=True)
cards = st.builds(
    _card, st.sampled_from(["4", "51", "37", "62"]), st.text("0123456789", min_size=14, max_size=14),
    st.sampled_from(["", " ", "-"]),
)  # fmt: skip
nrics = st.builds(
    lambda day, place, tail, sep: f"{day:%y%m%d}{sep}{place}{sep}{tail}",
    st.dates(min_value=date(1940, 1, 1), max_value=date(2020, 12, 31)),
    st.sampled_from(sorted(NRIC_BIRTHPLACE_CODES)),
    st.text("0123456789", min_size=4, max_size=4),
    st.sampled_from(["-", ""]),
)
phones = st.one_of(
    st.from_regex(r"\+60 1[0-9]-[0-9]{3} [0-9]{4}", fullmatch=True),
    st.from_regex(r"01[0-9]-[0-9]{3} [0-9]{4}", fullmatch=True),
    st.from_regex(r"\+65 [89][0-9]{3} [0-9]{4}", fullmatch=True),
    st.from_regex(r"1[3-9][0-9] [0-9]{4} [0-9]{4}", fullmatch=True),
    st.from_regex(r"\([2-9][0-9]{2}\) [2-9][0-9]{2}-[0-9]{4}", fullmatch=True),
)
secrets_ = st.one_of(emails, cards, nrics, phones)
fillers = st.lists(st.sampled_from(["saya", "nak", "refund", "parcel", "please", "call", "me", "退款", "谢谢", "lah"]),
                   max_size=4).map(" ".join)  # fmt: skip


def sentence(filler: str, secret: str, tail: str) -> str:
    return " ".join(part for part in (filler, secret, tail) if part)


def assert_never_seen(server: Server, secrets: list[str]) -> None:
    sent = list(server.fake.received)
    stored = [text for (text,) in server.rows("SELECT content FROM dw_message_embeddings")]
    stored += [text for (text,) in server.rows("SELECT data FROM dw_index_documents")]
    assert sent, "nothing reached the embedder: the property would hold vacuously"
    for secret in secrets:
        leaks = [
            t for t in [*sent, *stored] if secret in t or " ".join(secret.split()) in " ".join(t.split())
        ]
        assert leaks == [], f"{secret!r} reached the model or the database: {leaks[:2]}"


@PROPERTY
@given(
    parts=st.lists(st.tuples(fillers, secrets_, fillers), min_size=1, max_size=4), name=st.sampled_from(NAMES)
)
async def test_redaction_keeps_pii_from_the_embedder_and_the_database(server, parts, name):
    server.reset()
    texts = [sentence(*p) for p in parts]
    secrets = [secret for _, secret, _ in parts]
    start = datetime.now(UTC) - timedelta(days=2)

    # The sweep: each text a message of a closed conversation (substantial once redacted).
    enable_semantic_search(server.url, "org-a")
    insert_events(server.url, [("org-a", "whatsapp", "c1", f"{t} about my parcel refund", start + timedelta(minutes=i))
                               for i, t in enumerate(texts)])  # fmt: skip
    assert (await server.sweep_all()).windows_embedded == 1
    # Search queries.
    for text in texts:
        await server.search.Search(search_pb2.SearchRequest(org_id="org-a", query=text[:8000]), timeout=30)
    # The index: upsert, query, update, agent context — names known to the caller too.
    named = [f"{name}: {t}" for t in texts]
    await server.index.Upsert(index_pb2.UpsertRequest(namespace="kb", known_names=[name], documents=[
        index_pb2.Document(id=f"d{i}", data=t, metadata=to_struct({"appId": "app", "type": "knowledge"}))
        for i, t in enumerate(named)]), timeout=30)  # fmt: skip
    for text in texts:
        await server.index.Query(index_pb2.QueryRequest(namespace="kb", data=text), timeout=30)
    await server.index.Update(index_pb2.UpdateRequest(namespace="kb", id="d0", data=texts[-1]), timeout=30)
    await server.index.BuildAgentContext(index_pb2.BuildAgentContextRequest(
        namespace="kb", message=named[0], app_id="app", known_names=[name], rerank=True), timeout=30)  # fmt: skip

    assert_never_seen(server, [*secrets, name])
