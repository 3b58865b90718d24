"""The plaintext health port: the kubelet's gRPC probes reach health while the main
port speaks (mutual) TLS only, and nothing but health is served there."""

import asyncio
import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from polling import until
from rel_pki import make_pki, openssl_missing

from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.common.tls import ServerTls
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_testkit.fakes import FakeEmbedder
from dwsearch_testkit.net import free_port

SERVICE = "dwsearch.v1.EmbedderService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    reason = openssl_missing()
    if reason:
        pytest.skip(reason)
    return make_pki(tmp_path_factory.mktemp("pki"))


def host(tls=None, health_port=0, servicer=None) -> GrpcHost:
    servicer = servicer or FakeEmbedder()
    return GrpcHost(
        "127.0.0.1:0",
        [Service(SERVICE, lambda s: pb_grpc.add_EmbedderServiceServicer_to_server(servicer, s))],
        tls=tls,
        health_port=health_port,
    )


async def check(channel, service=""):
    stub = health_pb2_grpc.HealthStub(channel)
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status


async def test_health_port_answers_in_plaintext_beside_mutual_tls(pki):
    tls = ServerTls(pki.read("server.pem"), pki.read("server.key"), client_ca=pki.read("ca.pem"))
    health_port = free_port()
    server = host(tls, health_port)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as probe:
            assert await check(probe) == NOT_SERVING
            await server.set_serving(True)
            assert await check(probe) == SERVING and await check(probe, SERVICE) == SERVING
            # Health only: the service itself is not reachable without TLS.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.EmbedderServiceStub(probe).Info(pb.EmbedderServiceInfoRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await check(plaintext)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.secure_channel(f"localhost:{port}", pki.credentials()) as secure:
            assert await check(secure) == SERVING
    finally:
        await server.stop(0)


async def test_health_port_reports_not_serving_while_the_main_port_drains(pki):
    tls = ServerTls(pki.read("server.pem"), pki.read("server.key"), client_ca=pki.read("ca.pem"))
    slow = FakeEmbedder(delay=1.0)
    health_port = free_port()
    server = host(tls, health_port, slow)
    port = await server.start()
    await server.set_serving(True)
    async with grpc.aio.secure_channel(f"localhost:{port}", pki.credentials()) as secure:
        request = pb.EmbedRequest(inputs=["draining"])
        in_flight = asyncio.ensure_future(pb_grpc.EmbedderServiceStub(secure).Embed(request, timeout=10))
        await until(lambda: slow.calls > 0, what="the call reaching the servicer")
        stopping = asyncio.ensure_future(server.stop(5))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as probe:
            # The in-flight call holds the drain open; the probe sees it, not a closed port.
            assert await check(probe) == NOT_SERVING
        assert len((await in_flight).embeddings) == 1  # drained, not cut
        await stopping


@pytest.mark.parametrize("which", ["listen address", "health port"])
async def test_a_taken_port_stops_start_up_naming_it(which):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = GrpcHost(
            f"127.0.0.1:{port if which == 'listen address' else 0}",
            [],
            health_port=port if which == "health port" else 0,
        )
        with pytest.raises(SystemExit, match=f"127.0.0.1:{port} \\({which}\\)"):
            await server.start()
        await server.server.stop(0)


async def test_no_health_port_by_default():
    server = host()
    await server.start()
    assert server.health_server is None
    await server.stop(0)
