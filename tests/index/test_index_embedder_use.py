"""How the index uses the embedder: queries and agent context in the interactive lane,
upserts and updates in the bulk lane; a repeated query or agent context costs no Embed
call with the query cache."""

from __future__ import annotations

from dwsearch.clients.querycache import QueryCache
from dwsearch.index.service import to_struct
from dwsearch.v1 import index_pb2 as pb
from dwsearch_testkit.fakes import FakeReranker

DOCS = [
    pb.Document(
        id="t1",
        data="refund for broken blender",
        metadata=to_struct({"type": "conversation", "appId": "shop"}),
    ),
    pb.Document(id="k1", data="blender care", metadata=to_struct({"type": "knowledge", "appId": "shop"})),
]


async def test_writes_are_bulk_and_queries_interactive(make_stub, fake_embedder, fake_reranker: FakeReranker):
    stub = await make_stub(reranker=fake_reranker.address)
    await stub.Upsert(pb.UpsertRequest(documents=DOCS))
    await stub.Update(pb.UpdateRequest(id="t1", data="refund for a broken blender"))
    assert fake_embedder.priorities == ["PRIORITY_BULK", "PRIORITY_BULK"]
    fake_embedder.priorities.clear()
    await stub.Query(pb.QueryRequest(data="broken blender"))
    await stub.BuildAgentContext(
        pb.BuildAgentContextRequest(message="blender refund", app_id="shop", rerank=True)
    )
    assert fake_embedder.priorities == ["PRIORITY_INTERACTIVE", "PRIORITY_INTERACTIVE"]
    assert fake_reranker.priorities == ["PRIORITY_INTERACTIVE"]


async def test_repeated_queries_and_agent_contexts_embed_once(make_stub, fake_embedder):
    cache = QueryCache(1024 * 1024)
    stub = await make_stub(query_cache=cache)
    await stub.Upsert(pb.UpsertRequest(documents=DOCS))
    fake_embedder.embed_calls = 0
    first = await stub.Query(pb.QueryRequest(data="broken blender", include_data=True))
    again = await stub.Query(pb.QueryRequest(data="broken blender", include_data=True))
    assert [d.id for d in again.results] == [d.id for d in first.results] and first.results
    assert fake_embedder.embed_calls == 1
    # Another mode asks for other vectors: its own entry.
    await stub.Query(pb.QueryRequest(data="broken blender", mode=pb.QUERY_MODE_DENSE))
    await stub.Query(pb.QueryRequest(data="broken blender", mode=pb.QUERY_MODE_DENSE))
    assert fake_embedder.embed_calls == 2
    # BuildAgentContext embeds the message as a hybrid query: the first query's entry.
    await stub.BuildAgentContext(pb.BuildAgentContextRequest(message="broken blender", app_id="shop"))
    await stub.BuildAgentContext(pb.BuildAgentContextRequest(message="broken blender", app_id="shop"))
    assert fake_embedder.embed_calls == 2
    # Upserts are never served from the cache.
    await stub.Upsert(pb.UpsertRequest(documents=[pb.Document(id="x", data="broken blender")]))
    assert fake_embedder.embed_calls == 3


async def test_known_names_change_the_redacted_text_and_so_the_key(make_stub, fake_embedder):
    stub = await make_stub(query_cache=QueryCache(1024 * 1024))
    await stub.Upsert(pb.UpsertRequest(documents=DOCS))
    fake_embedder.embed_calls = 0
    fake_embedder.received.clear()
    request = pb.BuildAgentContextRequest(message="Aminah wants a refund", app_id="shop")
    await stub.BuildAgentContext(request)
    request.known_names.append("Aminah")
    await stub.BuildAgentContext(request)
    await stub.BuildAgentContext(request)
    assert fake_embedder.embed_calls == 2
    assert fake_embedder.received == ["Aminah wants a refund", "[NAME] wants a refund"]
