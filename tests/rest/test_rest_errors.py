"""One error classification (dwsearch.common.errors.classify) for both transports, its kind
mapped by each one's table (dwsearch.common.grpcstatus, dwsearch.common.httpstatus): the
same failure of the index answers the same status on gRPC (IndexService) and on REST (the
Upstash API), a database outage UNAVAILABLE and 503 alike; what an internal error says
leaks nothing on either."""

from __future__ import annotations

import grpc
import httpx
import psycopg
import pytest

from dwsearch.clients.embedder import EmbedderClient
from dwsearch.common import errors
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.common.grpcstatus import GRPC_STATUS
from dwsearch.common.httpstatus import http_status
from dwsearch.index.context import AgentContextBuilder
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.service import SERVICE_NAME, IndexService
from dwsearch.v1 import index_pb2 as pb
from dwsearch.v1 import index_pb2_grpc
from dwsearch_testkit.fakes import FAKE_MODEL

FAILURES = [
    (errors.InvalidArgument("ids: bad"), grpc.StatusCode.INVALID_ARGUMENT, 400),
    (
        errors.FailedPrecondition("the embedder serves another model"),
        grpc.StatusCode.FAILED_PRECONDITION,
        400,
    ),
    (errors.NotFound("no such thing"), grpc.StatusCode.NOT_FOUND, 404),
    (errors.ResourceExhausted("the CPU pool is full"), grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    (errors.Unavailable("embedder down"), grpc.StatusCode.UNAVAILABLE, 503),
    (errors.DeadlineExceeded("too slow"), grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    (TimeoutError(), grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    (psycopg.OperationalError("connection refused"), grpc.StatusCode.UNAVAILABLE, 503),
    (psycopg.errors.StringDataRightTruncation("value too long"), grpc.StatusCode.INVALID_ARGUMENT, 400),
    (errors.Internal("embedder returned a malformed dense vector"), grpc.StatusCode.INTERNAL, 500),
    (
        psycopg.errors.UndefinedColumn('column "secret" does not exist: SELECT secret FROM t'),
        grpc.StatusCode.INTERNAL,
        500,
    ),
    (RuntimeError("/srv/secret/path exploded"), grpc.StatusCode.INTERNAL, 500),
]


@pytest.fixture
async def index_stub(pool, fake_embedder):
    embedder = EmbedderClient(fake_embedder.address, timeout=5)
    index = DocumentIndex(pool, embedder, model=FAKE_MODEL)
    service = IndexService(index, AgentContextBuilder(index, None, rerank_timeout=1.0))
    host = GrpcHost(
        "127.0.0.1:0",
        [Service(SERVICE_NAME, lambda s: index_pb2_grpc.add_IndexServiceServicer_to_server(service, s))],
    )
    port = await host.start()
    await host.set_serving(True)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield index_pb2_grpc.IndexServiceStub(channel)
    await channel.close()
    await host.stop(0)
    await embedder.close()


@pytest.mark.parametrize(("failure", "code", "status"), FAILURES, ids=lambda v: type(v).__name__)
async def test_the_same_failure_answers_the_same_status_on_grpc_and_rest(
    index_stub, rest_url, monkeypatch, failure, code, status
):
    async def failing(self, *args, **kwargs):
        raise failure

    monkeypatch.setattr(DocumentIndex, "fetch", failing)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await index_stub.Fetch(pb.FetchRequest(namespace="ns", ids=["a"]))
    async with httpx.AsyncClient(base_url=rest_url) as http:
        response = await http.post(
            "/fetch", headers={"Authorization": "Bearer dense-token"}, json={"ids": ["a"]}
        )
    assert raised.value.code() == code
    kind = errors.classify(failure).kind
    assert GRPC_STATUS[kind] == code
    assert response.status_code == status == http_status(kind)
    if status == 500:  # nothing of the cause reaches a REST client; gRPC says only our own words
        assert response.json() == {"error": "internal error"}
        assert "secret" not in (raised.value.details() or "")
    else:
        assert response.json()["error"] == raised.value.details()
