from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import grpc
import pytest

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.db.pool import open_pool
from dwsearch.search.searcher import Searcher
from dwsearch.search.service import SERVICE_NAME, SearchService
from dwsearch.search.settings import SearchSettings
from dwsearch.v1 import search_pb2_grpc
from dwsearch_testkit.fakes import FAKE_MODEL, FakeReranker, fake_sparse, fake_vector
from dwsearch_testkit.seed import T0, enable_semantic_search, insert_events, insert_window


@dataclass
class Corpus:
    url: str

    def messages(
        self, org: str, channel: str, texts: list[str], start: datetime = T0, provider: str = "whatsapp"
    ):
        rows = [(org, provider, channel, t, start + timedelta(minutes=i)) for i, t in enumerate(texts)]
        return insert_events(self.url, rows)

    def window(
        self,
        org: str,
        channel: str,
        texts: list[str],
        start: datetime = T0,
        model: str = FAKE_MODEL,
        provider: str = "whatsapp",
        ids: list[str] | None = None,
        vector: Callable = fake_vector,
    ) -> tuple[str, list[str]]:
        """Messages plus their embedded window (`vector`'s vectors of the window text:
        the fake embedder's by default)."""
        ids = ids or self.messages(org, channel, texts, start, provider)
        content = "\n".join(texts)
        window_id = insert_window(
            self.url,
            org=org,
            model=model,
            provider=provider,
            channel=channel,
            message_ids=ids,
            content=content,
            start=start,
            end=start + timedelta(minutes=len(texts) - 1),
            dense=vector(content, 32),
            sparse=fake_sparse(content),
        )
        return window_id, ids


@pytest.fixture
def corpus(db_url) -> Corpus:
    enable_semantic_search(db_url, "org-a", "org-b")
    return Corpus(db_url)


@pytest.fixture
async def pool(db_url):
    pool = await open_pool(db_url, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
async def fake_reranker():
    fake = FakeReranker()
    await fake.start()
    yield fake
    await fake.stop()


SETTINGS = {f.name for f in dataclasses.fields(SearchSettings)}


@pytest.fixture
async def make_searcher(pool, fake_embedder):
    clients = []

    def make(
        *, reranker: str | None = None, embedder: str | None = None, embed_timeout=10.0, **kwargs
    ) -> Searcher:
        """A Searcher over the test pool: SearchSettings' fields by name (models, or model
        alone: FAKE_MODEL by default), the other keywords the Searcher's own."""
        e = EmbedderClient(embedder or fake_embedder.address, timeout=5)
        r = RerankerClient(reranker, timeout=5) if reranker else None
        clients.extend(c for c in (e, r) if c is not None)
        settings = {name: kwargs.pop(name) for name in list(kwargs) if name in SETTINGS}
        models = tuple(settings.pop("models", ())) or (kwargs.pop("model", FAKE_MODEL),)
        return Searcher(
            pool,
            e,
            r,
            SearchSettings(
                models=models,
                embed_timeout=embed_timeout,
                rerank_timeout=settings.pop("rerank_timeout", 10.0),
                **settings,
            ),
            **kwargs,
        )

    yield make
    for client in clients:
        await client.close()


@dataclass
class Served:
    stub: search_pb2_grpc.SearchServiceStub
    port: int


@pytest.fixture
async def serve_search():
    """serve_search(searcher, **GrpcHost options): a SearchService over `searcher` on a
    real socket, its port and a stub to call it; stopped after the test."""
    hosts, channels = [], []

    async def serve(searcher: Searcher, **options) -> Served:
        service = SearchService(searcher)
        host = GrpcHost(
            "127.0.0.1:0",
            [
                Service(
                    SERVICE_NAME, lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(service, s)
                )
            ],
            **options,
        )
        port = await host.start()
        hosts.append(host)
        await host.set_serving(True)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        channels.append(channel)
        return Served(search_pb2_grpc.SearchServiceStub(channel), port)

    yield serve
    for channel in channels:
        await channel.close()
    for host in hosts:
        await host.stop(0)


@pytest.fixture
async def search_stub(make_searcher, serve_search):
    """A SearchService on a real socket, and a stub to call it."""
    return (await serve_search(make_searcher())).stub
