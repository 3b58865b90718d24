"""A fake EmbedderService as its own process, so a benchmark measures the server the way
it runs in production: embedder, server and client in separate processes.

    python -m bench.fake_embedder --port 50152 --dimension 1024 --topics
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import signal

import numpy as np

from dwsearch_testkit.fakes import FakeEmbedder, fake_vector

# Real embeddings cluster by topic; uniform random vectors in many dimensions have no
# meaningful nearest neighbours (an HNSW recall figure over them means nothing).
TOPIC_COUNT = 256
TOPIC_NOISE = 0.6


@functools.lru_cache(maxsize=4)
def _topics(dimension: int) -> np.ndarray:
    return np.random.default_rng(1234).standard_normal((TOPIC_COUNT, dimension), dtype=np.float32)


def topic_vectors(rng: np.random.Generator, n: int, dimension: int) -> np.ndarray:
    picks = _topics(dimension)[rng.integers(0, TOPIC_COUNT, n)]
    vectors = picks + TOPIC_NOISE * rng.standard_normal((n, dimension), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def topic_vector(text: str, dimension: int) -> np.ndarray:
    """A vector near one topic, chosen by the text."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return topic_vectors(np.random.default_rng(seed), 1, dimension)[0]


async def serve(port: int, dimension: int, topics: bool, sparse: bool) -> None:
    fake = FakeEmbedder(
        dimension=dimension, sparse_supported=sparse, vector_fn=topic_vector if topics else fake_vector
    )
    fake.port = port
    await fake.start(f"127.0.0.1:{port}")
    print(f"fake embedder on {fake.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await fake.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dimension", type=int, default=1024)
    p.add_argument("--topics", action="store_true", help="vectors with topic structure")
    p.add_argument("--sparse", action="store_true", help="also serve sparse weights")
    args = p.parse_args()
    asyncio.run(serve(args.port, args.dimension, args.topics, args.sparse))


if __name__ == "__main__":
    main()
