"""Every Embed response is checked against the expected model (EmbedResponse.model_id):
with round robin over pods mid-rollout, one call can reach a pod of another model."""

import pytest

from dwsearch.clients.embedder import EmbedderClient, ModelMismatch
from dwsearch.common.errors import FailedPrecondition
from dwsearch_testkit.fakes import FAKE_MODEL, FakeEmbedder


async def test_a_response_of_another_model_is_refused_behind_round_robin():
    right, wrong = FakeEmbedder(), FakeEmbedder(model_id="fake/other-model-v2")
    for fake in (right, wrong):
        await fake.start()
    client = EmbedderClient(f"ipv4:{right.address},{wrong.address}", timeout=5, expected_model=FAKE_MODEL)
    refused = 0
    try:
        for i in range(20):
            try:
                await client.embed([f"hello {i}"])
            except ModelMismatch as exc:
                assert isinstance(exc, FailedPrecondition)
                assert "fake/other-model-v2" in str(exc) and FAKE_MODEL in str(exc)
                refused += 1
        assert refused > 0 and refused == wrong.embed_calls  # every call the other pod answered
        assert right.embed_calls == 20 - refused
        # A call's own expectation overrides the client's; empty = not checked.
        with pytest.raises(ModelMismatch):
            for _ in range(4):
                await client.embed(["x"], expected_model="fake/third-model")
        for _ in range(4):
            await client.embed(["x"], expected_model="")
    finally:
        await client.close()
        for fake in (right, wrong):
            await fake.stop()


async def test_an_unnamed_model_is_refused_when_one_is_expected(fake_embedder):
    fake_embedder.model_id = ""
    client = EmbedderClient(fake_embedder.address, timeout=5, expected_model=FAKE_MODEL)
    try:
        with pytest.raises(ModelMismatch, match="none"):
            await client.embed(["hello"])
    finally:
        await client.close()


async def test_info_of_another_model_is_refused(fake_embedder):
    """The one model check covers Info too: Search and the Index rely on it."""
    client = EmbedderClient(fake_embedder.address, timeout=5, model=FAKE_MODEL)
    try:
        assert (await client.info()).model_id == FAKE_MODEL
        fake_embedder.model_id = "someone/else"
        with pytest.raises(ModelMismatch, match="someone/else"):
            await client.info()
        unchecked = EmbedderClient(fake_embedder.address, timeout=5)
        assert (await unchecked.info()).model_id == "someone/else"  # no model named: not checked
        await unchecked.close()
    finally:
        await client.close()


async def test_for_model_shares_the_channel_and_checks_its_own_model(fake_embedder):
    client = EmbedderClient(fake_embedder.address, timeout=5)
    other = client.for_model("fake/other-model-v2")
    assert client.for_model("") is client and other.for_model("fake/other-model-v2") is other
    try:
        assert (other.model, other.expected_model) == ("fake/other-model-v2", "fake/other-model-v2")
        assert (client.model, client.expected_model) == ("", "")  # the original is unchanged
        with pytest.raises(ModelMismatch, match="fake/other-model-v2"):
            await other.embed(["hello"])
        await other.close()  # not its channel: the original still works
        assert len(await client.embed(["hello"])) == 1
    finally:
        await client.close()
