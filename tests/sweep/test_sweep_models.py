"""Several models at once (DWSEARCH_EMBED_MODELS): each sweep embeds every closed window
for each model, an independent pass with its own watermarks over a client of that model;
a model the embedder does not serve is left out with its reason, the others are swept."""

from collections import Counter

import grpc
import numpy as np
import pytest
from sweep_harness import Harness, sweep_once

from dwsearch.common.errors import FailedPrecondition
from dwsearch.sweep.service import progress_to_pb
from dwsearch_testkit.fakes import FAKE_MODEL, Failure, fake_vector

SECOND = "fake/second-model"
MISSING = "fake/not-served"


def chat(n: int, start: float = 0, tag: str = "m") -> list[tuple[float, str]]:
    return [(start + i, f"{tag} message number {i} about the invoice") for i in range(n)]


async def test_each_model_gets_every_window_in_its_own_space(harness: Harness):
    harness.fake.models = (SECOND,)
    for c in range(3):
        harness.insert(f"c{c}", chat(3, tag=f"c{c}"))
    progress = await sweep_once(harness.sweeper(models=(FAKE_MODEL, SECOND)))

    expected = await harness.expected()
    assert set(harness.embedded(FAKE_MODEL)) == set(harness.embedded(SECOND)) == expected
    assert [(m.model, m.windows_embedded, m.keys_total, m.keys_done, m.error) for m in progress.models] == [
        (FAKE_MODEL, 3, 3, 3, ""),
        (SECOND, 3, 3, 3, ""),
    ]
    assert (progress.model, progress.windows_embedded, progress.keys_total) == (FAKE_MODEL, 6, 6)
    assert all(harness.watermark(f"c{c}", model) for c in range(3) for model in (FAKE_MODEL, SECOND))
    # Every request of a pass (Info, CountTokens, Embed) named its model.
    requested = Counter(harness.fake.requested_models)
    assert set(requested) == {FAKE_MODEL, SECOND} and requested[FAKE_MODEL] == requested[SECOND]
    # Each model's vectors are of its own space.
    for model, salt in ((FAKE_MODEL, ""), (SECOND, f"{SECOND}\n")):
        for content, embedding in harness.query(
            "SELECT content, embedding::text FROM dw_message_embeddings WHERE model = %s", (model,)
        ):
            stored = np.array([float(x) for x in embedding.strip("[]").split(",")])
            assert np.allclose(stored, fake_vector(salt + content, harness.fake.dimension), atol=1e-3)

    # Caught up: a second sweep finds nothing for either model.
    again = await sweep_once(harness.sweeper(models=(FAKE_MODEL, SECOND)))
    assert [(m.keys_total, m.windows_finished) for m in again.models] == [(0, 0), (0, 0)]


async def test_a_model_the_embedder_does_not_serve_is_left_out_and_the_others_swept(harness: Harness):
    harness.fake.models = (SECOND,)
    ids = harness.insert("c1", chat(2))
    progress = await sweep_once(harness.sweeper(models=(MISSING, FAKE_MODEL)))

    assert [m.model for m in progress.models] == [MISSING, FAKE_MODEL]  # the configured order
    missing, served = progress.models
    assert missing.error.startswith("FAILED_PRECONDITION: ") and MISSING in missing.error
    assert (missing.keys_total, missing.windows_finished) == (0, 0)
    assert (served.error, served.windows_embedded, served.keys_done) == ("", 1, 1)
    assert harness.embedded(FAKE_MODEL) == [tuple(ids)] and harness.embedded(MISSING) == []
    assert harness.watermark("c1", MISSING) is None  # nothing written for it

    response = progress_to_pb(progress)
    assert [(m.model, m.windows_embedded, m.error) for m in response.models] == [
        (MISSING, 0, missing.error),
        (FAKE_MODEL, 1, ""),
    ]
    assert response.model == MISSING and response.windows_embedded == 1


async def test_a_sweep_fails_when_no_model_can_be_swept(harness: Harness):
    harness.fake.models = (SECOND,)
    harness.insert("c1", chat(2))
    with pytest.raises(FailedPrecondition, match=MISSING):
        await sweep_once(harness.sweeper(models=(MISSING, "fake/also-missing")))
    assert harness.query("SELECT count(*) FROM dw_sweep_watermarks") == [(0,)]


async def test_a_stalled_key_names_its_model(harness: Harness):
    harness.fake.models = (SECOND,)
    harness.insert("c1", chat(2, tag="fails"))
    text = "fails message number 0 about the invoice\nfails message number 1 about the invoice"
    # An outage on the window's Embed calls stalls the key in each model's pass.
    harness.fake.fail_texts[text] = Failure(grpc.StatusCode.UNAVAILABLE, "restarting")
    progress = await sweep_once(harness.sweeper(models=(FAKE_MODEL, SECOND)))
    assert sorted((s.model, s.key.external_channel_id) for s in progress.stalled) == [
        (FAKE_MODEL, "c1"),
        (SECOND, "c1"),
    ]
    assert [s.model for s in progress_to_pb(progress).stalled] == [s.model for s in progress.stalled]
