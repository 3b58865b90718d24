"""Search's fusion settings end to end: SearchRequest.fusion / fusion_weights over the
server's default (DWSEARCH_FUSION / DWSEARCH_FUSION_WEIGHTS), SearchResponse.fusion, and
each hit's legs (SearchHit.sources)."""

import grpc
import pytest

from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.search.query import SearchQuery
from dwsearch.search.service import SERVICE_NAME, SearchService
from dwsearch.v1 import search_pb2 as pb
from dwsearch.v1 import search_pb2_grpc
from dwsearch_testkit.fakes import FAKE_MODEL


@pytest.fixture
async def stub_of(make_searcher):
    """stub_of(**searcher_kwargs): a SearchService on a real socket, and a stub to call it."""
    opened = []

    async def make(**kwargs):
        service = SearchService(make_searcher(**kwargs))
        host = GrpcHost(
            "127.0.0.1:0",
            [
                Service(
                    SERVICE_NAME, lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(service, s)
                )
            ],
        )
        port = await host.start()
        await host.set_serving(True)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        opened.append((host, channel))
        return search_pb2_grpc.SearchServiceStub(channel)

    yield make
    for host, channel in opened:
        await channel.close()
        await host.stop(0)


def seed_two(corpus) -> None:
    # A swept window the query's meaning is near, and a message not swept yet that full
    # text matches word for word.
    corpus.window("org-a", "c1", ["where is my parcel", "it has not arrived"])
    corpus.messages("org-a", "c2", ["order ORD-5521 refund approved"])


async def test_request_fusion_and_weights_reach_the_fusion(corpus, stub_of):
    seed_two(corpus)
    stub = await stub_of()
    request = pb.SearchRequest(org_id="org-a", query="refund ORD-5521", limit=10)
    default = await stub.Search(request)
    assert default.fusion == pb.SEARCH_FUSION_WEIGHTED  # DEFAULT_METHOD
    request.fusion = pb.SEARCH_FUSION_RRF
    assert (await stub.Search(request)).fusion == pb.SEARCH_FUSION_RRF

    request.fusion = pb.SEARCH_FUSION_WEIGHTED
    request.fusion_weights["dense"] = 0.0
    request.fusion_weights["fts"] = 1.0
    only_fts = await stub.Search(request)
    assert only_fts.fusion == pb.SEARCH_FUSION_WEIGHTED
    first, *rest = only_fts.hits
    assert first.kind == pb.HIT_KIND_MESSAGE and first.score == pytest.approx(1.0)
    assert all(h.score == 0 for h in rest)  # found by the weight-0 leg only: kept, last

    request.fusion_weights.clear()
    request.fusion_weights["fts"] = 0.0
    only_dense = await stub.Search(request)
    assert only_dense.hits[0].kind == pb.HIT_KIND_WINDOW


async def test_hits_name_their_legs_by_model(corpus, stub_of):
    seed_two(corpus)
    stub = await stub_of()
    resp = await stub.Search(pb.SearchRequest(org_id="org-a", query="refund ORD-5521", limit=10))
    by_kind = {h.kind: h for h in resp.hits}
    window, message = by_kind[pb.HIT_KIND_WINDOW], by_kind[pb.HIT_KIND_MESSAGE]
    assert set(window.sources) == {f"dense:{FAKE_MODEL}"}
    assert window.sources[f"dense:{FAKE_MODEL}"].rank == window.dense.rank > 0
    assert set(message.sources) == {"fts"} and message.sources["fts"].rank == message.fts.rank == 1


async def test_server_default_fusion_and_weights(corpus, stub_of):
    seed_two(corpus)
    stub = await stub_of(fusion="rrf", fusion_weights={"fts": 0.0})
    request = pb.SearchRequest(org_id="org-a", query="refund ORD-5521", limit=10)
    resp = await stub.Search(request)
    assert resp.fusion == pb.SEARCH_FUSION_RRF and resp.hits[0].kind == pb.HIT_KIND_WINDOW
    # The request's weight for a leg wins over the server's.
    request.fusion_weights["fts"] = 5.0
    resp = await stub.Search(request)
    assert resp.hits[0].kind == pb.HIT_KIND_MESSAGE
    # FTS mode fuses nothing.
    resp = await stub.Search(pb.SearchRequest(org_id="org-a", query="ORD-5521", mode=pb.SEARCH_MODE_FTS))
    assert resp.fusion == pb.SEARCH_FUSION_UNSPECIFIED


@pytest.mark.parametrize(
    ("fusion", "weights", "detail"),
    [
        (7, {}, "unknown fusion 7"),
        (0, {"bm25": 1.0}, "fusion weight 'bm25'"),
        (0, {"fts": -1.0}, "must be a finite number >= 0"),
        (0, {"dense": float("inf")}, "must be a finite number >= 0"),
        (0, {"dense:": 1.0}, "fusion weight 'dense:'"),
    ],
)
async def test_bad_fusion_settings_are_invalid_argument(stub_of, fusion, weights, detail):
    stub = await stub_of()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Search(pb.SearchRequest(org_id="org-a", query="x", fusion=fusion, fusion_weights=weights))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and detail in err.value.details()


async def test_searcher_reports_the_method_it_fused_with(corpus, make_searcher):
    seed_two(corpus)
    result = await make_searcher().search(SearchQuery("org-a", "parcel", fusion="weighted"))
    assert result.fusion == "weighted" and result.hits


async def test_explain_names_the_fusion_profile_the_fusion_started_from(corpus, stub_of):
    from dwsearch.search.profiles import profile_for

    seed_two(corpus)
    profile = profile_for(["some/model"])  # the default profile
    stub = await stub_of(profile=profile)
    request = pb.SearchRequest(org_id="org-a", query="parcel", limit=10)
    assert (await stub.Search(request)).fusion_profile == ""  # only explained
    request.explain = True
    assert (await stub.Search(request)).fusion_profile == profile.name == "default"
    request.mode = pb.SEARCH_MODE_FTS
    assert (await stub.Search(request)).fusion_profile == ""  # nothing fused


def test_serve_refuses_bad_fusion_weights_at_start():
    from dwsearch.common.config import ServerConfig, load
    from dwsearch.common.errors import StartupError
    from dwsearch.serve import fusion_weights

    good = load(ServerConfig, environ={"DWSEARCH_FUSION_WEIGHTS": "fts=0.5, dense:use-multilingual-v3=2"})
    assert fusion_weights(good) == {"fts": 0.5, "dense:use-multilingual-v3": 2.0}
    with pytest.raises(StartupError, match=r"DWSEARCH_FUSION_WEIGHTS .*fts='x': not a number"):
        fusion_weights(load(ServerConfig, environ={"DWSEARCH_FUSION_WEIGHTS": "fts=x"}))
    with pytest.raises(SystemExit, match="expected one of profile, rrf, weighted"):
        load(ServerConfig, environ={"DWSEARCH_FUSION": "borda"})
