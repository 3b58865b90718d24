"""SearchService.Similar over a real Postgres and real gRPC: the org's closed windows most
like one conversation (given by a message, a window or a channel's time range), its own
windows left out; an open conversation embedded on the fly and never stored; the flags,
the model column and tenancy as everywhere; every bad request refused with its reason."""

from datetime import timedelta

import grpc
import numpy as np
import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dwsearch.flags import MODULE_FLAG
from dwsearch.redaction import REDACTION_ON
from dwsearch.search import conversation as conv
from dwsearch.search.query import SimilarQuery
from dwsearch.search.rows import ContextRow
from dwsearch.sweep import window as sweep_window
from dwsearch.v1 import search_pb2 as pb
from dwsearch_testkit.fakes import FAKE_MODEL, Failure, FakeEmbedder, fake_vector
from dwsearch_testkit.seed import T0, enable_semantic_search, insert_events, set_org_flag

SECOND = "fake/second-v1"

# Topic words in English and Malay: a text's vector leans on its topic's axis whatever its
# language, as a multilingual model's does (the fake embedder's own vectors depend on the
# exact text only).
TOPICS = [
    ("refund", "money back", "wang", "dipulangkan", "bayaran balik"),
    ("parcel", "delivery", "barang", "sampai", "penghantaran"),
    ("password", "login", "kata laluan", "log masuk"),
]


def topic_vector(text: str, dimension: int) -> np.ndarray:
    v = 0.3 * fake_vector(text, dimension)
    for axis, words in enumerate(TOPICS):
        if any(word in text.lower() for word in words):
            v[axis] += 1.0
    return (v / np.linalg.norm(v)).astype(np.float32)


ENGLISH_REFUND = ["I want a refund for order 5521", "please send my money back"]
ENGLISH_PARCEL = ["where is my parcel", "the delivery is two days late"]
ENGLISH_LOGIN = ["I cannot login", "reset my password please"]
MALAY_REFUND = ["saya mahu wang saya dipulangkan", "tolong proses bayaran balik"]


@pytest.fixture
async def topic_embedder():
    fake = FakeEmbedder(vector_fn=topic_vector)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def topic_stub(make_searcher, serve_search, topic_embedder):
    return (await serve_search(make_searcher(embedder=topic_embedder.address))).stub


def topics_corpus(corpus) -> dict[str, str]:
    """English windows of three topics in org-a, each in its own channel."""
    return {
        name: corpus.window("org-a", f"en-{name}", texts, start=T0 + timedelta(hours=i), vector=topic_vector)[
            0
        ]
        for i, (name, texts) in enumerate(
            [("refund", ENGLISH_REFUND), ("parcel", ENGLISH_PARCEL), ("login", ENGLISH_LOGIN)]
        )
    }


def ids(response) -> list[str]:
    return [h.id for h in response.hits]


def conversation(channel: str, start, end, provider: str = "whatsapp") -> pb.Conversation:
    c = pb.Conversation(provider=provider, external_channel_id=channel)
    c.start_time.FromDatetime(start)
    c.end_time.FromDatetime(end)
    return c


def row_counts(url: str) -> dict[str, int]:
    tables = ("dw_message_embeddings", "dw_sweep_windows", "dw_sweep_window_events", "dw_sweep_watermarks")
    with psycopg.connect(url) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}


# --- what it finds -------------------------------------------------------------------------


async def test_a_malay_conversation_finds_the_english_one_of_its_topic(corpus, topic_stub, topic_embedder):
    english = topics_corpus(corpus)
    malay, _ = corpus.window("org-a", "ms-1", MALAY_REFUND, start=T0 + timedelta(days=1), vector=topic_vector)
    response = await topic_stub.Similar(pb.SimilarRequest(org_id="org-a", window_id=malay), timeout=5)
    assert ids(response)[0] == english["refund"] and malay not in ids(response)
    assert set(ids(response)) == set(english.values())
    top = response.hits[0]
    assert top.kind == pb.HIT_KIND_WINDOW and top.text == "\n".join(ENGLISH_REFUND)
    assert top.sources[f"dense:{FAKE_MODEL}"].rank == 1 and list(top.highlights) == []
    assert response.model == FAKE_MODEL and response.fusion == pb.SEARCH_FUSION_WEIGHTED
    assert not response.degraded and list(response.embedded_models) == []
    assert topic_embedder.embed_calls == 0  # stored vectors: the embedder is not asked


async def test_an_open_conversation_is_embedded_on_the_fly_and_nothing_is_written(
    corpus, topic_stub, topic_embedder
):
    english = topics_corpus(corpus)
    open_ids = corpus.messages("org-a", "ms-live", MALAY_REFUND, start=T0 + timedelta(days=2))
    before = row_counts(corpus.url)
    response = await topic_stub.Similar(pb.SimilarRequest(org_id="org-a", message_id=open_ids[-1]), timeout=5)
    assert ids(response)[0] == english["refund"]
    assert list(response.embedded_models) == [FAKE_MODEL]
    # The conversation's messages as a window's chunk text, in the interactive lane.
    assert topic_embedder.received == ["\n".join(MALAY_REFUND)]
    assert topic_embedder.priorities == ["PRIORITY_INTERACTIVE"]
    assert row_counts(corpus.url) == before  # never stored: no window, ledger or watermark
    span = response.conversation
    assert (span.provider, span.external_channel_id) == ("whatsapp", "ms-live")
    assert span.start_time.ToDatetime(T0.tzinfo) == T0 + timedelta(days=2)
    assert span.end_time.ToDatetime(T0.tzinfo) == T0 + timedelta(days=2, minutes=1)

    # The same conversation by its channel and time range.
    by_range = await topic_stub.Similar(
        pb.SimilarRequest(
            org_id="org-a",
            conversation=conversation("ms-live", T0 + timedelta(days=2), T0 + timedelta(days=2, hours=1)),
        ),
        timeout=5,
    )
    assert ids(by_range) == ids(response) and list(by_range.embedded_models) == [FAKE_MODEL]
    assert topic_embedder.received[-1] == "\n".join(MALAY_REFUND)
    assert row_counts(corpus.url) == before


async def test_an_open_message_stands_for_its_session_only(corpus, make_searcher, fake_embedder):
    corpus.window("org-a", "other", ["refund please"])
    corpus.messages("org-a", "live", ["last week's chat"], start=T0 - timedelta(days=7))
    session = corpus.messages("org-a", "live", ["hello\nthere", "my refund", "order 5521"], start=T0)
    corpus.messages("org-a", "live", ["much later"], start=T0 + timedelta(hours=3))
    result = await make_searcher().similar(SimilarQuery("org-a", message_id=session[1]))
    assert fake_embedder.received == ["hello there\nmy refund\norder 5521"]  # line breaks as spaces
    assert (result.conversation.start, result.conversation.end) == (T0, T0 + timedelta(minutes=2))
    assert result.embedded_models == [FAKE_MODEL] and [h.text for h in result.hits] == ["refund please"]


async def test_an_open_conversation_is_redacted_before_it_is_embedded(corpus, make_searcher, fake_embedder):
    [open_id] = corpus.messages("org-a", "live", ["call me at +60123456789"])
    searcher = make_searcher(redaction=REDACTION_ON)
    await searcher.similar(SimilarQuery("org-a", message_id=open_id))
    assert fake_embedder.received == ["call me at [PHONE]"]


async def test_the_conversations_own_windows_are_left_out(corpus, make_searcher, search_stub):
    texts = ["my refund has not arrived", "order 5521"]
    first, first_ids = corpus.window("org-a", "c1", texts)
    # The same session's next window, another model's window over the first one's
    # messages, and a window elsewhere with the very same text (the nearest there is).
    later, _ = corpus.window("org-a", "c1", ["still waiting for it"], start=T0 + timedelta(minutes=5))
    corpus.window("org-a", "c1", texts, model=SECOND, ids=first_ids)
    twin, _ = corpus.window("org-a", "c2", texts, start=T0 + timedelta(days=1))
    unrelated, _ = corpus.window("org-a", "c3", ["totally different words"], start=T0 + timedelta(days=2))

    by_window = await search_stub.Similar(pb.SimilarRequest(org_id="org-a", window_id=first), timeout=5)
    assert ids(by_window)[0] == twin and first not in ids(by_window)
    assert set(ids(by_window)) == {twin, later, unrelated}
    assert by_window.hits[0].sources[f"dense:{FAKE_MODEL}"].score == pytest.approx(1.0, abs=1e-2)
    assert by_window.hits[0].sources[f"sparse:{FAKE_MODEL}"].rank == 1  # the sparse leg, fused

    by_message = await search_stub.Similar(
        pb.SimilarRequest(org_id="org-a", message_id=first_ids[1]), timeout=5
    )
    assert set(ids(by_message)) == {twin, later, unrelated}  # its window's span: `later` is not in it

    whole = conversation("c1", T0, T0 + timedelta(minutes=10))
    by_range = await search_stub.Similar(pb.SimilarRequest(org_id="org-a", conversation=whole), timeout=5)
    assert set(ids(by_range)) == {twin, unrelated}  # both of c1's windows are the conversation's
    assert list(by_range.embedded_models) == []  # their mean is the query


async def test_the_hnsw_path_leaves_the_conversations_windows_out_too(corpus, make_searcher):
    from psycopg import AsyncConnection

    from dwsearch.search.store.knn import create_hnsw_index

    texts = ["my refund has not arrived"]
    anchor, _ = corpus.window("org-a", "c1", texts)
    twin, _ = corpus.window("org-a", "c2", texts, start=T0 + timedelta(days=1))
    async with await AsyncConnection.connect(corpus.url, autocommit=True) as conn:
        await create_hnsw_index(conn, FAKE_MODEL, 32)
    result = await make_searcher(hnsw=True).similar(SimilarQuery("org-a", window_id=anchor))
    assert [h.id for h in result.hits] == [twin]


async def test_windows_of_models_not_active_are_never_returned(corpus, search_stub):
    texts = ["where is my parcel"]
    anchor, _ = corpus.window("org-a", "c1", texts)
    corpus.window("org-a", "c2", texts, model="another/model", start=T0 + timedelta(days=1))
    mine, _ = corpus.window("org-a", "c3", ["parcel late"], start=T0 + timedelta(days=2))
    response = await search_stub.Similar(pb.SimilarRequest(org_id="org-a", window_id=anchor), timeout=5)
    assert ids(response) == [mine]


async def test_each_active_model_has_its_legs_and_a_model_without_a_window_embeds(
    corpus, make_searcher, fake_embedder
):
    fake_embedder.models = (SECOND,)
    texts = ["refund please", "order 5521"]
    _, anchor_ids = corpus.window("org-a", "c1", texts)  # the first model's only
    twin, twin_ids = corpus.window("org-a", "c2", texts, start=T0 + timedelta(days=1))
    corpus.window("org-a", "c2", texts, model=SECOND, ids=twin_ids, start=T0 + timedelta(days=1),
                  vector=lambda text, d: fake_vector(f"{SECOND}\n{text}", d))  # fmt: skip
    result = await make_searcher(models=(FAKE_MODEL, SECOND)).similar(
        SimilarQuery("org-a", message_id=anchor_ids[0])
    )
    assert result.embedded_models == [SECOND] and fake_embedder.received == ["\n".join(texts)]
    [hit] = result.hits
    assert hit.id == twin and {f"dense:{FAKE_MODEL}", f"dense:{SECOND}"} <= set(hit.sources)
    assert result.model == f"{FAKE_MODEL},{SECOND}"


async def test_context_messages_apply(corpus, search_stub):
    anchor, _ = corpus.window("org-a", "c1", ["refund please"])
    corpus.messages("org-a", "c2", ["hi"], start=T0 + timedelta(days=1))
    found, _ = corpus.window("org-a", "c2", ["refund please now"], start=T0 + timedelta(days=1, minutes=1))
    response = await search_stub.Similar(
        pb.SimilarRequest(org_id="org-a", window_id=anchor, context_messages=2), timeout=5
    )
    [hit] = response.hits
    assert hit.id == found and [m.text for m in hit.context_before] == ["hi"]


# --- tenancy, flags, failures -------------------------------------------------------------


async def test_another_orgs_windows_and_ids_are_never_seen(corpus, search_stub):
    texts = ["my refund has not arrived"]
    anchor, anchor_ids = corpus.window("org-a", "c1", texts)
    theirs, their_ids = corpus.window("org-b", "c2", texts, start=T0 + timedelta(days=1))
    mine, _ = corpus.window("org-a", "c3", ["refund arrived"], start=T0 + timedelta(days=2))
    response = await search_stub.Similar(pb.SimilarRequest(org_id="org-a", window_id=anchor), timeout=5)
    assert ids(response) == [mine]
    # org-b's own answer holds only its windows: org-a's three are the same or near.
    alone = await search_stub.Similar(pb.SimilarRequest(org_id="org-b", window_id=theirs), timeout=5)
    assert ids(alone) == []
    for request in (
        pb.SimilarRequest(org_id="org-a", window_id=theirs),
        pb.SimilarRequest(org_id="org-a", message_id=their_ids[0]),
        pb.SimilarRequest(org_id="org-b", message_id=anchor_ids[0]),
        pb.SimilarRequest(org_id="org-a", conversation=conversation("c2", T0, T0 + timedelta(days=2))),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await search_stub.Similar(request, timeout=5)
        assert err.value.code() is grpc.StatusCode.NOT_FOUND, request


async def test_unknown_ids_and_ineligible_messages_are_not_found(corpus, search_stub):
    corpus.window("org-a", "c1", ["refund please"])
    [denied] = insert_events(corpus.url, [("org-a", "whatsapp", "c1", "spam", T0)], decision="denied")
    unknown = "00000000-0000-4000-8000-000000000000"
    for request, needle in (
        (pb.SimilarRequest(org_id="org-a", message_id=unknown), f"no eligible message '{unknown}'"),
        (pb.SimilarRequest(org_id="org-a", message_id=denied), "no eligible message"),
        (pb.SimilarRequest(org_id="org-a", window_id=unknown), f"no window '{unknown}'"),
        (
            pb.SimilarRequest(
                org_id="org-a", conversation=conversation("nowhere", T0, T0 + timedelta(hours=1))
            ),
            "no eligible message in that conversation",
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await search_stub.Similar(request, timeout=5)
        assert err.value.code() is grpc.StatusCode.NOT_FOUND and needle in err.value.details()


@pytest.mark.parametrize(
    "flag,needle",
    [
        ("module", "org flag digital_worker is off"),
        ("admin", "admin flag digital_worker_semantic_search is off"),
    ],
)
async def test_flags_off_is_failed_precondition_with_the_reason(
    corpus, search_stub, fake_embedder, flag, needle
):
    anchor, _ = corpus.window("org-a", "c1", ["refund please"])
    if flag == "module":
        set_org_flag(corpus.url, "org-a", MODULE_FLAG, False)
    else:
        enable_semantic_search(corpus.url, "org-a", admin=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await search_stub.Similar(pb.SimilarRequest(org_id="org-a", window_id=anchor), timeout=5)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "semantic search is off for org 'org-a'" in err.value.details() and needle in err.value.details()
    assert fake_embedder.calls == 0


async def test_an_unknown_org_has_semantic_search_off(corpus, search_stub):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await search_stub.Similar(
            pb.SimilarRequest(org_id="nobody", message_id="00000000-0000-4000-8000-000000000000"), timeout=5
        )
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION


async def test_no_model_able_to_embed_the_open_conversation_is_unavailable(
    corpus, search_stub, fake_embedder
):
    corpus.window("org-a", "c1", ["refund please"])
    [open_id] = corpus.messages("org-a", "live", ["my refund"], start=T0 + timedelta(days=1))
    fake_embedder.fail_texts["my refund"] = Failure(grpc.StatusCode.INTERNAL, "model crashed")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await search_stub.Similar(pb.SimilarRequest(org_id="org-a", message_id=open_id), timeout=5)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "no model could embed the open conversation" in err.value.details()


async def test_one_model_failing_degrades_and_the_other_answers(corpus, make_searcher, fake_embedder):
    from dwsearch.retrieval.degradation import Degradation

    fake_embedder.models = ("fake/third-v1",)  # SECOND is not served: refused FAILED_PRECONDITION
    twin, _ = corpus.window("org-a", "c1", ["refund please"])
    [open_id] = corpus.messages("org-a", "live", ["refund please"], start=T0 + timedelta(days=1))
    result = await make_searcher(models=(FAKE_MODEL, SECOND)).similar(
        SimilarQuery("org-a", message_id=open_id)
    )
    assert [h.id for h in result.hits] == [twin] and result.embedded_models == [FAKE_MODEL]
    [(reason, detail)] = result.degradations
    assert reason is Degradation.EMBEDDER_UNAVAILABLE and SECOND in detail


# --- bad requests ---------------------------------------------------------------------------

UUID_A = "00000000-0000-4000-8000-00000000000a"
RANGE = {"provider": "whatsapp", "external_channel_id": "c1"}


def _conversation(**fields) -> pb.Conversation:
    c = pb.Conversation(**{k: v for k, v in fields.items() if k in ("provider", "external_channel_id")})
    if "start" in fields:
        c.start_time.FromDatetime(fields["start"])
    if "end" in fields:
        c.end_time.FromDatetime(fields["end"])
    return c


WHOLE_DAY = {**RANGE, "start": T0, "end": T0 + timedelta(days=1)}


@pytest.mark.parametrize(
    "request_kwargs,needle",
    [
        ({"window_id": UUID_A}, "org_id is required"),
        ({"org_id": "  ", "window_id": UUID_A}, "org_id is required"),
        ({"org_id": "org\x00a", "window_id": UUID_A}, "org_id: NUL character"),
        ({"org_id": "org-a"}, "give exactly one of message_id, window_id or conversation"),
        ({"org_id": "org-a", "message_id": UUID_A, "window_id": UUID_A}, "got message_id and window_id"),
        (
            {"org_id": "org-a", "message_id": UUID_A, "conversation": _conversation(**WHOLE_DAY)},
            "got message_id and conversation",
        ),
        (
            {
                "org_id": "org-a",
                "message_id": UUID_A,
                "window_id": UUID_A,
                "conversation": _conversation(**WHOLE_DAY),
            },
            "got message_id and window_id and conversation",
        ),
        ({"org_id": "org-a", "message_id": "5521"}, "message_id = '5521' is not a dw_chat_events id (UUID)"),
        ({"org_id": "org-a", "window_id": "w-1"}, "window_id = 'w-1' is not a window"),
        ({"org_id": "org-a", "message_id": "x" * 65}, "message_id: 65 bytes; the limit is 64"),
        ({"org_id": "org-a", "conversation": _conversation()}, "conversation.provider is required"),
        (
            {"org_id": "org-a", "conversation": _conversation(provider="whatsapp", start=T0, end=T0)},
            "conversation.external_channel_id is required",
        ),
        (
            {"org_id": "org-a", "conversation": _conversation(**RANGE, start=T0)},
            "conversation.start_time and conversation.end_time are required",
        ),
        (
            {"org_id": "org-a", "conversation": _conversation(**RANGE, end=T0)},
            "conversation.start_time and conversation.end_time are required",
        ),
        (
            {"org_id": "org-a", "conversation": _conversation(**RANGE, start=T0 + timedelta(days=1), end=T0)},
            "conversation.start_time is after conversation.end_time",
        ),
        (
            {"org_id": "org-a", "conversation": _conversation(**{**WHOLE_DAY, "provider": "wa\x00"})},
            "conversation.provider: NUL character",
        ),
        (
            {"org_id": "org-a", "conversation": _conversation(**{**WHOLE_DAY, "provider": "p" * 257})},
            "conversation.provider: 257 bytes",
        ),
        ({"org_id": "org-a", "window_id": UUID_A, "limit": 101}, "limit must be between 1 and 100"),
        (
            {"org_id": "org-a", "window_id": UUID_A, "context_messages": 21},
            "context_messages must be between 0 and 20",
        ),
        ({"org_id": "org-a", "window_id": UUID_A, "fusion": 42}, "unknown fusion"),
        ({"org_id": "org-a", "window_id": UUID_A, "fusion_weights": {"bm25": 1.0}}, "fusion weight 'bm25'"),
        ({"org_id": "org-a", "window_id": UUID_A, "fusion_weights": {"dense": -1.0}}, "finite number >= 0"),
    ],
)
async def test_bad_requests_are_invalid_argument(search_stub, corpus, fake_embedder, request_kwargs, needle):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await search_stub.Similar(pb.SimilarRequest(**request_kwargs), timeout=5)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details()
    assert fake_embedder.calls == 0


async def test_a_limit_in_range_is_kept(corpus, search_stub):
    anchor, _ = corpus.window("org-a", "c0", ["refund please"])
    for i in range(1, 4):
        corpus.window("org-a", f"c{i}", [f"refund please {i}"], start=T0 + timedelta(days=i))
    assert (
        len((await search_stub.Similar(pb.SimilarRequest(org_id="org-a", window_id=anchor, limit=2))).hits)
        == 2
    )
    assert len((await search_stub.Similar(pb.SimilarRequest(org_id="org-a", window_id=anchor))).hits) == 3


# --- the sweep's rules, restated -------------------------------------------------------------


def test_the_session_gap_and_chunk_lines_are_the_sweeps():
    assert conv.SESSION_GAP == sweep_window.SESSION_GAP
    assert conv.OPEN_SESSION_REACH <= sweep_window.MAX_WINDOW_MESSAGES * 2


@given(
    st.text(
        alphabet=st.sampled_from(["a", " ", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\t", "é"])
    )
)
def test_a_message_is_the_line_the_sweep_writes(text):
    assert conv.chunk_line(text) == sweep_window.chunk_line(text)


def test_an_open_session_stops_at_the_gap_either_side():
    def row(name: str, minutes: int) -> ContextRow:
        return ContextRow(name, T0 + timedelta(minutes=minutes), name)

    before = [row("old", -100), row("b2", -40), row("b1", -10)]  # gaps 60, 30, 10
    after = [row("a1", 29), row("a2", 58), row("late", 88)]  # gaps 29, 29, 30
    anchor = row("anchor", 0)
    assert [r.id for r in conv.session_around(before, anchor, after)] == ["b1", "anchor", "a1", "a2"]
    assert [r.id for r in conv.session_around([], anchor, [])] == ["anchor"]


def test_every_search_rpc_takes_a_search_token_and_a_small_request():
    from dwsearch.common.config import ServerConfig
    from dwsearch.common.rpcpolicy import MethodPolicy, Scope
    from dwsearch.serve import SMALL_REQUEST_BYTES, method_policies

    policies = method_policies(ServerConfig())
    methods = pb.DESCRIPTOR.services_by_name["SearchService"].methods_by_name
    assert set(methods) == {"Search", "Similar"}
    for name in methods:
        assert policies[f"/dwsearch.v1.SearchService/{name}"] == MethodPolicy(
            Scope.SEARCH, SMALL_REQUEST_BYTES
        )
