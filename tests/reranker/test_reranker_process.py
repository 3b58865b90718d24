"""`run_reranker`: NOT_SERVING until the model is loaded and warm, SERVING after, and a
clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from model_servers import LoadedRerank, until_serving

from dwsearch.common.config import RerankerConfig, load
from dwsearch.reranker.main import run_reranker
from dwsearch.v1 import reranker_pb2 as pb
from dwsearch.v1 import reranker_pb2_grpc as pb_grpc

SERVICE = "dwsearch.v1.RerankerService"


class SlowLoading(LoadedRerank):
    def __init__(self, loaded: LoadedRerank) -> None:
        self.inner, self.loaded = loaded.inner, loaded.loaded
        self.release = threading.Event()

    def load(self):  # type: ignore[no-untyped-def]
        assert self.release.wait(30)
        return self.loaded


async def test_health_follows_loading_and_sigterm_stops(tiny_reranker, unused_tcp_port):
    backend = SlowLoading(tiny_reranker)
    cfg = load(
        RerankerConfig, {"listen_addr": f"127.0.0.1:{unused_tcp_port}", "grace_seconds": 5.0}, environ={}
    )
    server = asyncio.ensure_future(run_reranker(cfg, backend))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{unused_tcp_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest(service=SERVICE)
        status = (await health.Check(check, timeout=10, wait_for_ready=True)).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        backend.release.set()
        await until_serving(channel, SERVICE)
        response = await pb_grpc.RerankerServiceStub(channel).Rerank(
            pb.RerankRequest(query="refund", documents=["refund sent", "nasi lemak"]), timeout=10
        )
        assert len(response.results) == 2
    os.kill(os.getpid(), signal.SIGTERM)  # run_reranker's handler, on this loop
    await asyncio.wait_for(server, 10)
