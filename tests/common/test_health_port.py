"""The plaintext health port: the kubelet's gRPC probes reach health while the main
port speaks (mutual) TLS only, and nothing but health is served there."""

import asyncio
import socket

import grpc
import pytest
from fakes import FakeEmbedder
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rel_pki import make_pki, openssl_missing

from dwsearch.common.grpcserver import GrpcHost, Service
from dwsearch.common.tls import ServerTls
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc

SERVICE = "dwsearch.v1.EmbedderService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    reason = openssl_missing()
    if reason:
        pytest.skip(reason)
    return make_pki(tmp_path_factory.mktemp("pki"))


def host(tls=None, health_port=0) -> GrpcHost:
    return GrpcHost(
        "127.0.0.1:0",
        [Service(SERVICE, lambda s: pb_grpc.add_EmbedderServiceServicer_to_server(FakeEmbedder(), s))],
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
        stopping = asyncio.ensure_future(server.stop(1))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as probe:
            await asyncio.sleep(0.05)
            try:  # draining: the probe sees NOT_SERVING, or the port already closed
                assert await check(probe) == NOT_SERVING
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
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
