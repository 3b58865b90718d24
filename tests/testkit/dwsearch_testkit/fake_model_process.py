"""The fake EmbedderService or RerankerService (tests/testkit/dwsearch_testkit/fakes.py) as a process of
its own, for fault tests that kill, stall or slow a model service under a real server.

    python tests/testkit/dwsearch_testkit/fake_model_process.py embedder|reranker --port N [--delay S]
        [--auth-token T] [--tls-cert F --tls-key F [--tls-client-ca F]] [--model-id ID]

`--model-id` makes the embedder another model: Info and every EmbedResponse name it, and
its vectors differ from the default model's for the same text (a pod of the old or the
new model during a rollout).

It writes events to stdout, one line each, flushed:
    ready <port>                  serving
    embed <json list of inputs>   an Embed call arrived (before any hold or delay)
    priority embed <PRIORITY_…>   its priority (the line before its `embed` line)
    rerank <number of documents>  a Rerank call arrived
    priority rerank <PRIORITY_…>  its priority (the line before its `rerank` line)
and reads commands from stdin, one per line:
    hold        calls that arrive from now on wait (after announcing themselves)
    release     let every waiting call go on
    delay <s>   add this delay to each call
It exits on SIGTERM or when stdin closes (the test that started it is gone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from pathlib import Path

# Run as a script (a process of its own): the test kit, for dwsearch_testkit.fakes.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.common.tls import server_tls
from dwsearch.v1 import embedder_pb2, embedder_pb2_grpc, reranker_pb2_grpc
from dwsearch_testkit.fakes import FAKE_MODEL, FakeEmbedder, FakeReranker, fake_vector


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Control:
    """The hold gate and the extra delay, driven from stdin."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.gate = asyncio.Event()
        self.gate.set()
        self.delay = 0.0

    async def wait(self) -> None:
        await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)

    def command(self, line: str) -> None:
        word, _, arg = line.strip().partition(" ")
        if word == "hold":
            self.gate.clear()
        elif word == "release":
            self.gate.set()
        elif word == "delay":
            self.delay = float(arg)
        elif word:
            emit(f"error unknown command {word!r}")
            return
        emit(f"ok {word}")

    def read_stdin(self, on_eof) -> None:
        for line in sys.stdin:
            self.loop.call_soon_threadsafe(self.command, line)
        self.loop.call_soon_threadsafe(on_eof)  # the test that started us is gone


class ControlledEmbedder(FakeEmbedder):
    control: Control | None = None

    async def Embed(self, request, context):
        emit("priority embed " + embedder_pb2.Priority.Name(request.priority))
        emit("embed " + json.dumps(list(request.inputs), ensure_ascii=False))
        assert self.control is not None
        await self.control.wait()
        return await super().Embed(request, context)


class ControlledReranker:
    def __init__(self, control: Control) -> None:
        from dwsearch_testkit.fakes import _FakeRerankerServicer

        self.inner = _FakeRerankerServicer(FakeReranker())
        self.control = control

    async def Rerank(self, request, context):
        emit("priority rerank " + embedder_pb2.Priority.Name(request.priority))
        emit(f"rerank {len(request.documents)}")
        await self.control.wait()
        return await self.inner.Rerank(request, context)

    async def Info(self, request, context):
        return await self.inner.Info(request, context)


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    control = Control(loop)
    control.delay = args.delay
    if args.kind == "embedder":
        fake = ControlledEmbedder()
        fake.control = control
        if args.model_id and args.model_id != FAKE_MODEL:
            model_id = args.model_id
            fake.model_id = model_id
            fake.vector_fn = lambda text, dimension: fake_vector(f"{model_id}\n{text}", dimension)
        service = Service(
            "dwsearch.v1.EmbedderService",
            lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(fake, s),
        )
    else:
        reranker = ControlledReranker(control)
        service = Service(
            "dwsearch.v1.RerankerService",
            lambda s: reranker_pb2_grpc.add_RerankerServiceServicer_to_server(reranker, s),
        )
    host = GrpcHost(
        f"127.0.0.1:{args.port}",
        [service],
        auth_token=args.auth_token,
        tls=server_tls(args.tls_cert, args.tls_key, args.tls_client_ca),
    )
    port = await host.start()
    await host.set_serving(True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    threading.Thread(target=control.read_stdin, args=(stop.set,), daemon=True).start()
    emit(f"ready {port}")
    await stop.wait()
    await host.stop(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["embedder", "reranker"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--auth-token", default="")
    parser.add_argument("--tls-cert", default="")
    parser.add_argument("--tls-key", default="")
    parser.add_argument("--tls-client-ca", default="")
    parser.add_argument("--model-id", default="")
    asyncio.run(main(parser.parse_args()))
