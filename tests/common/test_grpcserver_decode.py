"""A request whose bytes do not parse (malformed, or nested past protobuf's depth limit)
answers INVALID_ARGUMENT through the interceptor, after auth — gRPC alone answered
UNKNOWN "Unexpected DecodeError"."""

import grpc

from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_testkit.fakes import FakeEmbedder

SERVICE = "dwsearch.v1.EmbedderService"
MALFORMED = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, a length far past the end


async def raw_embed(port: int, payload: bytes, metadata=()) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            f"/{SERVICE}/Embed", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            await call(payload, timeout=10, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            assert exc.details(), exc
            return exc.code()
    return grpc.StatusCode.OK


async def test_undecodable_requests_are_invalid_arguments_after_auth():
    fake = FakeEmbedder()
    host = GrpcHost(
        "127.0.0.1:0",
        [Service(SERVICE, lambda s: pb_grpc.add_EmbedderServiceServicer_to_server(fake, s))],
        auth_token="sekrit",
    )
    port = await host.start()
    await host.set_serving(True)
    try:
        assert await raw_embed(port, MALFORMED) == grpc.StatusCode.UNAUTHENTICATED
        token = (("authorization", "Bearer sekrit"),)
        assert await raw_embed(port, MALFORMED, token) == grpc.StatusCode.INVALID_ARGUMENT
        assert fake.embed_calls == 0
    finally:
        await host.stop(0)
