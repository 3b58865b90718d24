"""An Embed request over SERIALIZE_INLINE_MAX characters (an upsert's batch of long
documents) is serialized in the CPU pool and sent as bytes: it answers exactly as the
same request serialized on the event loop, and the loop keeps waking meanwhile."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from dwsearch.clients import embedder as embedder_module
from dwsearch.clients.embedder import SERIALIZE_INLINE_MAX, EmbedderClient


async def test_a_large_request_answers_as_a_small_one_does(fake_embedder, monkeypatch):
    texts = [f"document {i} " + "about refunds and parcels " * 6000 for i in range(12)]
    assert sum(map(len, texts)) > SERIALIZE_INLINE_MAX
    client = EmbedderClient(fake_embedder.address, timeout=30)
    try:
        ticks, stop = [], asyncio.Event()

        async def tick() -> None:
            while not stop.is_set():
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.002)

        ticker = asyncio.ensure_future(tick())
        large = await client.embed(texts, sparse=True, truncate=True)
        stop.set()
        await ticker
        monkeypatch.setattr(embedder_module, "SERIALIZE_INLINE_MAX", 10**9)  # the same, on the loop
        inline = await client.embed(texts, sparse=True, truncate=True)
    finally:
        await client.close()
    assert fake_embedder.embed_sizes[-2:] == [12, 12]
    for a, b in zip(large, inline, strict=True):
        assert np.array_equal(a.dense, b.dense) and a.sparse == b.sparse and a.token_count == b.token_count
    assert len(ticks) > 1
