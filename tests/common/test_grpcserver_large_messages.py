"""Large messages stay off the event loop: a request message over LARGE_REQUEST_BYTES is
parsed in the CPU pool in pieces cut between its top-level fields, which make the message
parsing it whole makes (or fail as that does); a servicer's Serialized response goes out
as it is."""

import random
import threading

import grpc
import pytest
from google.protobuf.message import DecodeError

from dwsearch.common import interceptor
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.common.interceptor import (
    LARGE_REQUEST_BYTES,
    Serialized,
    _parse_in_pieces,
    _Undecodable,
    message_pieces,
)
from dwsearch.index.service import to_struct
from dwsearch.v1 import embedder_pb2 as embedder_pb
from dwsearch.v1 import embedder_pb2_grpc
from dwsearch.v1 import index_pb2 as pb
from dwsearch_testkit.fakes import FakeEmbedder

SERVICE = "dwsearch.v1.EmbedderService"


def big_upsert(documents: int = 200) -> pb.UpsertRequest:
    metadata = {f"field{k:02d}": f"{k:02d}" + "m" * 1150 for k in range(40)} | {"n": 1.5, "ok": True}
    return pb.UpsertRequest(
        namespace="meta",
        documents=[
            pb.Document(id=f"m{i}", data=f"document {i}", metadata=to_struct(metadata), vector=[0.25] * 8)
            for i in range(documents)
        ],
        known_names=["Nama bin Abdullah", "Siti"],
    )


def parsed_whole(raw: bytes) -> object:
    try:
        return pb.UpsertRequest.FromString(raw)
    except DecodeError:
        return None


def test_pieces_parse_to_the_message_a_whole_parse_makes():
    raw = big_upsert().SerializeToString()
    assert len(raw) > LARGE_REQUEST_BYTES
    pieces = list(message_pieces(raw, 256 * 1024))
    assert len(pieces) > 10
    assert b"".join(pieces) == raw
    assert all(len(p) >= 256 * 1024 for p in pieces[:-1])
    assert _parse_in_pieces(pb.UpsertRequest.FromString, raw) == pb.UpsertRequest.FromString(raw)


@pytest.mark.parametrize("seed", range(3))
def test_a_damaged_message_fails_or_parses_as_a_whole_parse_does(seed):
    rng = random.Random(seed)
    raw = big_upsert(12).SerializeToString()
    damaged = []
    for _ in range(40):  # cut short, a byte changed, bytes inserted
        cut = rng.randrange(len(raw))
        damaged += [raw[:cut], raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1 :]]
        damaged.append(raw[:cut] + rng.randbytes(rng.randrange(1, 12)) + raw[cut:])
    failed = 0
    for data in damaged:
        expected = parsed_whole(data)
        found = _parse_in_pieces(pb.UpsertRequest.FromString, data)
        if expected is None:
            failed += 1
            assert isinstance(found, _Undecodable)
        else:
            assert found == expected
    assert failed  # the damage is real: some of it does not parse


async def test_a_large_request_is_parsed_in_the_pool_and_a_serialized_response_sent_as_is(monkeypatch):
    parsed_in = []
    real_parse = interceptor._parse_in_pieces

    def parse(deserialize, raw):
        parsed_in.append(threading.get_ident())
        return real_parse(deserialize, raw)

    monkeypatch.setattr(interceptor, "_parse_in_pieces", parse)
    fake = FakeEmbedder()
    answer = embedder_pb.EmbedResponse(embeddings=[embedder_pb.Embedding(token_count=7)])
    received = []

    class Servicer(embedder_pb2_grpc.EmbedderServiceServicer):
        async def Embed(self, request, context):
            received.append(request)
            return Serialized(answer.SerializeToString()) if len(request.inputs) > 1 else answer

        async def Info(self, request, context):
            return await fake.Info(request, context)

    host = GrpcHost(
        "127.0.0.1:0",
        [Service(SERVICE, lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(Servicer(), s))],
    )
    port = await host.start()
    await host.set_serving(True)
    loop_thread = threading.get_ident()
    large = embedder_pb.EmbedRequest(inputs=[f"{i} " + "x" * 20_000 for i in range(64)], truncate=True)
    small = embedder_pb.EmbedRequest(inputs=["one"])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
            assert await stub.Embed(large, timeout=30) == answer
            assert await stub.Embed(small, timeout=30) == answer
            # A large message that does not parse: INVALID_ARGUMENT, as a small one is.
            raw = channel.unary_unary(
                f"/{SERVICE}/Embed", request_serializer=None, response_deserializer=None
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await raw(large.SerializeToString() + b"\x0a\xff\xff\xff\xff\x0f", timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await host.stop(0)
    assert received == [large, small]
    assert len(parsed_in) == 2 and loop_thread not in parsed_in  # the small one parsed inline
