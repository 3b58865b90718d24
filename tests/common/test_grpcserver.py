"""The shared bootstrap: health, reflection, the error-mapping interceptor, auth and
graceful drain, over real sockets."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from polling import until

from dwsearch.common import errors
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.common.interceptor import status_for
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_testkit.fakes import Failure, FakeEmbedder

SERVICE = "dwsearch.v1.EmbedderService"


class RaisingEmbedder(pb_grpc.EmbedderServiceServicer):
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def Info(self, request, context):
        raise self.exc


async def host_for(servicer, **kwargs) -> GrpcHost:
    host = GrpcHost(
        "127.0.0.1:0",
        [Service(SERVICE, lambda s: pb_grpc.add_EmbedderServiceServicer_to_server(servicer, s))],
        **kwargs,
    )
    await host.start()
    return host


async def health_status(channel, service=""):
    stub = health_pb2_grpc.HealthStub(channel)
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status


async def test_health_is_not_serving_until_ready():
    host = await host_for(FakeEmbedder())
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
        assert await health_status(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await health_status(channel, SERVICE) == health_pb2.HealthCheckResponse.NOT_SERVING
        await host.set_serving(True)
        assert await health_status(channel) == health_pb2.HealthCheckResponse.SERVING
        assert await health_status(channel, SERVICE) == health_pb2.HealthCheckResponse.SERVING
        await host.stop(1)


async def test_reflection_lists_services():
    host = await host_for(FakeEmbedder(), reflection=True)  # off unless asked (test_grpcserver_admission)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)

            async def requests():
                yield reflection_pb2.ServerReflectionRequest(list_services="")

            async for response in stub.ServerReflectionInfo(requests()):
                names = {s.name for s in response.list_services_response.service}
                break
        assert {SERVICE, "grpc.health.v1.Health"} <= names
    finally:
        await host.stop(0)


@pytest.mark.parametrize(
    "exc,code",
    [
        (errors.InvalidArgument("bad limit"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.FailedPrecondition("wrong model"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.ResourceExhausted("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.Unavailable("db down"), grpc.StatusCode.UNAVAILABLE),
        (errors.DeadlineExceeded("slow"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (TimeoutError(), grpc.StatusCode.DEADLINE_EXCEEDED),
        (ZeroDivisionError("boom"), grpc.StatusCode.INTERNAL),
    ],
)
async def test_interceptor_maps_errors(exc, code):
    host = await host_for(RaisingEmbedder(exc))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.EmbedderServiceStub(channel).Info(pb.EmbedderServiceInfoRequest(), timeout=5)
        assert info.value.code() == code
        if code is grpc.StatusCode.INTERNAL:
            assert "boom" not in info.value.details()  # internals are logged, not leaked
        else:
            assert str(exc) in info.value.details()
    finally:
        await host.stop(0)


def test_database_errors_map_to_unavailable():
    import psycopg

    assert status_for(psycopg.OperationalError("connection refused"))[0] == grpc.StatusCode.UNAVAILABLE


async def test_servicer_abort_passes_through():
    fake = FakeEmbedder(failures=[Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")])
    host = await host_for(fake)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.EmbedderServiceStub(channel).Embed(pb.EmbedRequest(inputs=["x"]), timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await host.stop(0)


async def test_bearer_token_required_except_for_health():
    host = await host_for(FakeEmbedder(), auth_token="s3cret")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            stub = pb_grpc.EmbedderServiceStub(channel)
            for metadata in [(), (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Info(pb.EmbedderServiceInfoRequest(), metadata=metadata, timeout=5)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = await stub.Info(
                pb.EmbedderServiceInfoRequest(), metadata=(("authorization", "Bearer s3cret"),)
            )
            assert ok.model_id
            assert await health_status(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await host.stop(0)


async def test_stop_drains_in_flight_calls():
    fake = FakeEmbedder(delay=0.5)
    host = await host_for(fake)
    await host.set_serving(True)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
        call = asyncio.ensure_future(
            pb_grpc.EmbedderServiceStub(channel).Embed(pb.EmbedRequest(inputs=["in flight"]), timeout=5)
        )
        await until(lambda: fake.calls == 1, what="the call reached the server")
        await host.stop(grace=5)
        response = await call
    assert len(response.embeddings) == 1
