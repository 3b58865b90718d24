"""Index hardening (issue 14): Update redacts the known names its request carries, as
Upsert does; a vector answered by another model is never stored."""

import grpc
import pytest

from dwsearch.redaction import NAME
from dwsearch.v1 import index_pb2 as pb
from dwsearch_testkit.fakes import FakeEmbedder

NAMES = ["Siti Nurhaliza", "Tan Wei Ming", "陈伟"]


async def test_update_redacts_the_known_names_of_its_request(stub, fake_embedder, snapshot):
    await stub.Upsert(pb.UpsertRequest(namespace="kb", known_names=NAMES, documents=[
        pb.Document(id="d0", data="Siti Nurhaliza asked about a refund")]), timeout=10)  # fmt: skip
    await stub.Update(pb.UpdateRequest(
        namespace="kb", id="d0", data="siti  nurhaliza and Tan Wei Ming called; 陈伟 too", known_names=NAMES),
        timeout=10)  # fmt: skip
    (row,) = snapshot()
    assert row[2] == f"{NAME} and {NAME} called; {NAME} too"
    for name in NAMES:
        assert all(name.lower() not in text.lower() for text in fake_embedder.received)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Update(
            pb.UpdateRequest(namespace="kb", id="d0", data="x", known_names=["n"] * 1001), timeout=10
        )
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "known_names" in error.value.details()


class OtherPodEmbedder(FakeEmbedder):
    """Info names the configured model; Embed responses another (a pod of the other
    model behind round robin answered)."""

    async def Embed(self, request, context):
        response = await super().Embed(request, context)
        response.model_id = "fake/other-model-v2"
        return response


async def test_an_upsert_or_update_answered_by_another_model_stores_nothing(make_stub, stub, snapshot):
    await stub.Upsert(pb.UpsertRequest(namespace="kb", documents=[pb.Document(id="d0", data="refund policy")]),
                      timeout=10)  # fmt: skip
    before = snapshot()
    other = OtherPodEmbedder()
    await other.start()
    try:
        mixed = await make_stub(embedder=other.address)
        for call in (
            mixed.Upsert(
                pb.UpsertRequest(namespace="kb", documents=[pb.Document(id="d1", data="returns")]), timeout=10
            ),
            mixed.Update(pb.UpdateRequest(namespace="kb", id="d0", data="new refund policy"), timeout=10),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await call
            assert error.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "answered with model 'fake/other-model-v2'" in error.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await mixed.Query(pb.QueryRequest(namespace="kb", data="refund"), timeout=10)
        assert error.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    finally:
        await other.stop()
    assert snapshot() == before
