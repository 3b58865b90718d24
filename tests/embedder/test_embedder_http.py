"""The embedder's HTTP port (dwsearch_embedder.http): the official OpenAI and Cohere SDKs and TEI's JSON
against a real socket, each answer compared with gRPC's Embed for the same input on the
same engine; errors in each API's shape; admission's 413 / 429; lanes; auth; readiness
and drain; metrics."""

from __future__ import annotations

import asyncio
import base64
import ssl

import cohere
import httpx
import numpy as np
import openai
import pytest
from cohere.core.api_error import ApiError
from model_http import embedder_http
from model_servers import GatedEmbedding
from polling import until
from prometheus_client import REGISTRY
from rel_pki import make_pki, openssl_missing

from dwsearch.modelserver.batching import Lane
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_embedder.engine import EngineLimits

TEXTS = [
    "where is my parcel, the tracking number does not work",
    "boleh saya tukar alamat penghantaran?",
    "我的订单什么时候到",
    "lah the refund still belum masuk",
]


async def grpc_embed(served, texts, **fields) -> pb.EmbedResponse:
    request = pb.EmbedRequest(inputs=texts, priority=pb.PRIORITY_INTERACTIVE, **fields)
    return await pb_grpc.EmbedderServiceStub(served.channel).Embed(request, timeout=30)


def dense(response: pb.EmbedResponse) -> np.ndarray:
    return np.array([list(e.dense) for e in response.embeddings], dtype=np.float32)


def sdk(served, **kwargs) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=kwargs.pop("api_key", "unused"), base_url=f"{served.url}/v1", max_retries=0
    )


async def test_openai_sdk_float_matches_grpc(tiny_bge_m3):
    async with embedder_http(tiny_bge_m3) as served:
        model = served.engine.info.model_id
        answer = await sdk(served).embeddings.create(model=model, input=TEXTS, encoding_format="float")
        expected = await grpc_embed(served, TEXTS)
    vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
    assert [d.index for d in answer.data] == [0, 1, 2, 3]
    np.testing.assert_array_equal(vectors, dense(expected))
    assert answer.model == model
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == expected.total_tokens > 0


async def test_openai_sdk_base64_default_matches_grpc(tiny_bge_m3):
    """The SDK's default asks for base64 and decodes it as little-endian float32."""
    async with embedder_http(tiny_bge_m3) as served:
        model = served.engine.info.model_id
        answer = await sdk(served).embeddings.create(model=model, input=TEXTS)
        expected = await grpc_embed(served, TEXTS)
        async with httpx.AsyncClient(base_url=served.url) as client:
            raw = await client.post(
                "/v1/embeddings", json={"model": model, "input": TEXTS[0], "encoding_format": "base64"}
            )
    vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
    np.testing.assert_array_equal(vectors, dense(expected))
    encoded = raw.json()["data"][0]["embedding"]
    assert isinstance(encoded, str)
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(encoded), dtype="<f4"), dense(expected)[0])


async def test_openai_single_string_models_and_dimensions(tiny_bge_m3):
    async with embedder_http(tiny_bge_m3) as served:
        info = served.engine.info
        client = sdk(served)
        one = await client.embeddings.create(
            model=info.model_id, input=TEXTS[1], dimensions=info.dimension, encoding_format="float"
        )
        expected = await grpc_embed(served, TEXTS[1:2])
        models = await client.models.list()
        with pytest.raises(openai.BadRequestError) as wrong_dimensions:
            await client.embeddings.create(model=info.model_id, input="x", dimensions=info.dimension // 2)
        with pytest.raises(openai.NotFoundError) as unknown_model:
            await client.embeddings.create(model="text-embedding-3-small", input="x")
    np.testing.assert_array_equal(np.array([one.data[0].embedding], dtype=np.float32), dense(expected))
    assert [m.id for m in models.data] == [info.model_id]
    error = wrong_dimensions.value.body
    assert f"gives {info.dimension}-dimensional vectors" in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_value"
    assert unknown_model.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(
    "body,status,message",
    [
        ({"input": []}, 400, "inputs is empty"),
        ({"input": ["ok", ""]}, 400, "input 1 is empty"),
        ({"input": [[1, 2, 3]]}, 400, "token ids"),
        ({"input": 7}, 400, "a string or a list of strings"),
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "x", "priority": "urgent"}, 400, "priority"),
        ({"input": ["x"] * 9}, 413, "9 inputs, over the limit of 8"),
    ],
)
async def test_openai_errors_have_openais_shape(e5, body, status, message):
    async with (
        embedder_http(e5, EngineLimits(max_inputs_per_request=8)) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        answer = await client.post("/v1/embeddings", json=body)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert message in error["message"] and set(error) >= {"message", "type", "code"}


async def test_a_body_that_is_not_json_is_422_in_each_shape(e5):
    async with embedder_http(e5) as served, httpx.AsyncClient(base_url=served.url) as client:
        openai_answer = await client.post("/v1/embeddings", content=b"{not json")
        tei_answer = await client.post("/embed", content=b"[1, 2]")
    assert openai_answer.status_code == 422 and "not JSON" in openai_answer.json()["error"]["message"]
    assert tei_answer.status_code == 422 and tei_answer.json()["error_type"] == "Validation"


async def test_tei_embed_matches_grpc(tiny_bge_m3):
    async with embedder_http(tiny_bge_m3) as served, httpx.AsyncClient(base_url=served.url) as client:
        normalized = await client.post("/embed", json={"inputs": TEXTS})
        raw = await client.post("/embed", json={"inputs": TEXTS[0], "normalize": False})
        expected = await grpc_embed(served, TEXTS)
        expected_raw = await grpc_embed(served, TEXTS[:1], normalize=False)
    assert normalized.status_code == 200
    np.testing.assert_array_equal(np.array(normalized.json(), dtype=np.float32), dense(expected))
    np.testing.assert_array_equal(np.array(raw.json(), dtype=np.float32), dense(expected_raw))
    assert abs(float(np.linalg.norm(dense(expected_raw)[0])) - 1) > 1e-3  # normalize false was honoured


async def test_tei_embed_sparse_matches_grpcs_sparse_weights(tiny_bge_m3):
    async with embedder_http(tiny_bge_m3) as served, httpx.AsyncClient(base_url=served.url) as client:
        answer = await client.post("/embed_sparse", json={"inputs": TEXTS})
        expected = await grpc_embed(served, TEXTS, dense=False, sparse=True)
    assert answer.status_code == 200
    for got, want in zip(answer.json(), expected.embeddings, strict=True):
        assert [w["index"] for w in got] == list(want.sparse.indices) and got
        np.testing.assert_array_equal(
            np.array([w["value"] for w in got], dtype=np.float32),
            np.array(want.sparse.values, dtype=np.float32),
        )


async def test_tei_embed_sparse_on_a_model_without_sparse_output_is_a_clear_error(e5):
    async with embedder_http(e5) as served, httpx.AsyncClient(base_url=served.url) as client:
        answer = await client.post("/embed_sparse", json={"inputs": ["hello"]})
    assert answer.status_code == 424
    body = answer.json()
    assert body["error_type"] == "Backend" and "has no sparse output" in body["error"]


async def test_tei_errors_info_and_health(e5):
    async with (
        embedder_http(e5, EngineLimits(max_inputs_per_request=8, max_request_bytes=1000)) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        empty = await client.post("/embed", json={"inputs": []})
        too_many = await client.post("/embed", json={"inputs": ["x"] * 9})
        too_large = await client.post("/embed", json={"inputs": ["x" * 1500]})
        info = (await client.get("/info")).json()
        health = await client.get("/health")
    assert (empty.status_code, empty.json()["error_type"]) == (400, "Empty")
    assert (too_many.status_code, too_many.json()["error_type"]) == (413, "Validation")
    assert too_large.status_code == 413 and "bytes of text per call" in too_large.json()["error"]
    assert info["model_id"] == served.engine.info.model_id and info["max_client_batch_size"] == 8
    assert info["dimension"] == served.engine.info.dimension and info["sparse_supported"] is False
    assert health.status_code == 200


async def test_too_long_input_is_413_unless_truncated(e5):
    async with (
        embedder_http(e5, EngineLimits(max_input_tokens=32)) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        long = " ".join(["word"] * 100)
        refused = await client.post("/embed", json={"inputs": [long]})
        cut = await client.post("/embed", json={"inputs": [long], "truncate": True})
        expected = await grpc_embed(served, [long], truncate=True)
    assert refused.status_code == 413 and "over the model's limit" in refused.json()["error"]
    np.testing.assert_array_equal(np.array(cut.json(), dtype=np.float32), dense(expected))


async def test_a_body_over_the_cap_is_413_in_each_apis_shape(e5):
    """The body cap (dwsearch.common.httpbody), by its Content-Length and as it streams in."""
    async with (
        embedder_http(e5, EngineLimits(max_request_bytes=1000)) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        cap = served.state.max_body_bytes
        declared = await client.post("/embed", content=b" " * (cap + 1))

        async def chunks():
            for _ in range(cap // 65536 + 2):
                yield b" " * 65536

        streamed = await client.post("/v1/embeddings", content=chunks())
    assert declared.status_code == 413 and declared.json() == {
        "error": f"the request body: {cap + 1} bytes; the limit is {cap}",
        "error_type": "Validation",
    }
    assert streamed.status_code == 413 and streamed.json()["error"] == {
        "message": f"the request body: over the limit of {cap} bytes",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_too_large",
    }


async def test_a_full_queue_is_429_with_retry_after(e5):
    backend = GatedEmbedding(e5)
    limits = EngineLimits(max_queue=4, max_batch_inputs=1, max_inputs_per_request=4)
    async with (
        embedder_http(backend, limits) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as client,
    ):
        backend.hold()
        running = asyncio.ensure_future(client.post("/embed", json={"inputs": ["in the model"]}))
        assert await asyncio.to_thread(backend.started.wait, 10)
        queued = asyncio.ensure_future(client.post("/embed", json={"inputs": ["a", "b", "c"]}))
        await until(lambda: served.engine.batcher.queued == 3)
        tei = await client.post("/embed", json={"inputs": ["one", "too many"]})
        oa = await client.post("/v1/embeddings", json={"input": ["one", "too many"]})
        backend.gate.set()
        assert (await running).status_code == 200 and (await queued).status_code == 200
    assert tei.status_code == 429 and tei.headers["retry-after"] == "1"
    assert tei.json()["error_type"] == "Overloaded" and "queue is full" in tei.json()["error"]
    assert oa.status_code == 429 and oa.headers["retry-after"] == "1"
    assert oa.json()["error"]["code"] == "rate_limit_exceeded"


async def test_http_requests_are_interactive_unless_they_say_bulk(e5):
    async with embedder_http(e5) as served, httpx.AsyncClient(base_url=served.url) as client:
        batcher = served.engine.batcher
        lanes: list[Lane] = []
        submit = batcher.submit

        async def recording(jobs, lengths, *, deadline=None, lane):
            lanes.append(lane)
            return await submit(jobs, lengths, deadline=deadline, lane=lane)

        batcher.submit = recording  # type: ignore[method-assign]
        await client.post("/embed", json={"inputs": ["a document"]})
        await client.post("/v1/embeddings", json={"input": "a document"})
        await client.post("/embed", json={"inputs": ["a document"], "priority": "bulk"})
        # Cohere's v2 priority is an integer, 0 the highest (its default): 0 interactive, more bulk.
        await client.post("/v1/embed", json={"texts": ["a document"]})
        await client.post("/v2/embed", json={"texts": ["a document"], "priority": 0})
        await client.post("/v2/embed", json={"texts": ["a document"], "priority": 1})
        await client.post("/v1/embed", json={"texts": ["a document"], "priority": "bulk"})
    assert lanes == [Lane.INTERACTIVE, Lane.INTERACTIVE, Lane.BULK] + [Lane.INTERACTIVE] * 2 + [Lane.BULK] * 2


async def test_bearer_tokens_are_checked_as_on_grpc(e5):
    async with embedder_http(e5, auth_token="s3cret") as served:
        with pytest.raises(openai.AuthenticationError) as refused:
            await sdk(served, api_key="wrong").embeddings.create(model="", input="x")
        ok = await sdk(served, api_key="s3cret").embeddings.create(
            model="", input="x", encoding_format="float"
        )
        async with httpx.AsyncClient(base_url=served.url) as client:
            tei = await client.post("/embed", json={"inputs": ["x"]})
            health = await client.get("/health")  # probes carry no token
    assert refused.value.status_code == 401 and refused.value.body["code"] == "invalid_api_key"
    assert len(ok.data) == 1
    assert tei.status_code == 401 and tei.json()["error_type"] == "Unauthorized"
    assert health.status_code == 200


async def test_not_ready_is_503_and_health_says_so(e5):
    async with embedder_http(e5, serving=False) as served, httpx.AsyncClient(base_url=served.url) as client:
        health = await client.get("/health")
        refused = await client.post("/embed", json={"inputs": ["x"]})
        await served.host.set_serving(True)
        after = await client.get("/health")
    assert health.status_code == 503 and after.status_code == 200
    assert refused.status_code == 503 and refused.json()["error_type"] == "Unhealthy"


async def test_drain_lets_the_request_in_flight_finish_and_refuses_new_ones(e5):
    backend = GatedEmbedding(e5)
    async with embedder_http(backend) as served, httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        backend.hold()
        running = asyncio.ensure_future(client.post("/embed", json={"inputs": ["in flight"]}))
        assert await asyncio.to_thread(backend.started.wait, 10)
        assert served.host.http is not None
        draining = asyncio.ensure_future(served.host.http.drain(30))
        await until(lambda: served.state.draining)
        refused = await client.post("/embed", json={"inputs": ["late"]})
        health = await client.get("/health")
        assert not draining.done()
        backend.gate.set()
        answer = await running
        await draining
    assert answer.status_code == 200 and len(answer.json()) == 1
    assert refused.status_code == 503 and "draining" in refused.json()["error"]
    assert health.status_code == 503


async def test_http_requests_are_counted_in_the_rpc_metrics(e5):
    labels = {"service": "dwsearch.v1.EmbedderService", "method": "HTTP /embed", "code": "OK"}
    before = REGISTRY.get_sample_value("dwsearch_grpc_requests_total", labels) or 0.0
    async with embedder_http(e5) as served, httpx.AsyncClient(base_url=served.url) as client:
        await client.post("/embed", json={"inputs": ["counted"]})
    assert REGISTRY.get_sample_value("dwsearch_grpc_requests_total", labels) == before + 1


async def test_the_http_port_speaks_mutual_tls_as_the_grpc_port_does(e5, tmp_path):
    if reason := openssl_missing():
        pytest.skip(reason)
    pki = make_pki(tmp_path / "pki")
    tls = {
        "tls_cert": pki.path("server.pem"),
        "tls_key": pki.path("server.key"),
        "tls_client_ca": pki.path("ca.pem"),
    }
    async with embedder_http(e5, tls=tls) as served:
        trusted = ssl.create_default_context(cafile=pki.path("ca.pem"))
        trusted.load_cert_chain(pki.path("client.pem"), pki.path("client.key"))
        async with httpx.AsyncClient(base_url=served.url, verify=trusted) as client:
            answer = await client.post("/embed", json={"inputs": ["over tls"]})
        anonymous = ssl.create_default_context(cafile=pki.path("ca.pem"))
        async with httpx.AsyncClient(base_url=served.url, verify=anonymous) as client:
            with pytest.raises(httpx.HTTPError):
                await client.post("/embed", json={"inputs": ["no client certificate"]})
    assert answer.status_code == 200 and len(answer.json()) == 1


async def test_tei_tokenize_matches_grpcs_token_counts(tiny_bge_m3):
    async with embedder_http(tiny_bge_m3) as served, httpx.AsyncClient(base_url=served.url) as client:
        answer = await client.post("/tokenize", json={"inputs": TEXTS})
        bare = await client.post("/tokenize", json={"inputs": TEXTS[0], "add_special_tokens": False})
        counts = await pb_grpc.EmbedderServiceStub(served.channel).CountTokens(
            pb.CountTokensRequest(inputs=TEXTS), timeout=30
        )
    assert answer.status_code == 200
    tokens = answer.json()
    assert [len(each) for each in tokens] == list(counts.token_counts)
    for text, each in zip(TEXTS, tokens, strict=True):
        assert each[0]["special"] and each[-1]["special"] and each[0]["start"] is None
        for token in each[1:-1]:
            assert not token["special"] and token["text"] == text[token["start"] : token["stop"]]
    assert [t["id"] for t in bare.json()[0]] == [t["id"] for t in tokens[0][1:-1]]


async def test_tei_tokenize_on_a_backend_without_token_offsets_says_so(e5):
    async with embedder_http(e5) as served, httpx.AsyncClient(base_url=served.url) as client:
        answer = await client.post("/tokenize", json={"inputs": ["hello"]})
    assert answer.status_code == 400 and "does not expose its tokens" in answer.json()["error"]


async def test_tei_decode_turns_tokenize_s_ids_back_into_text(tiny_bge_m3):
    async with embedder_http(tiny_bge_m3) as served, httpx.AsyncClient(base_url=served.url) as client:
        tokens = (await client.post("/tokenize", json={"inputs": TEXTS})).json()
        ids = [[t["id"] for t in each] for each in tokens]
        decoded = await client.post("/decode", json={"ids": ids})
        one = await client.post("/decode", json={"ids": ids[0], "skip_special_tokens": False})
        wrong = [
            await client.post("/decode", json=body)
            for body in ({"ids": []}, {"ids": "12"}, {"ids": [[1, "2"]]}, {"ids": [True]}, {})
        ]
        outside = await client.post("/decode", json={"ids": [[5, 10**9]]})
    assert decoded.status_code == 200
    assert [text.strip() for text in decoded.json()] == [text.strip() for text in TEXTS]
    (with_special,) = one.json()
    assert with_special.startswith("<s>") and with_special.endswith("</s>")  # XLM-R's, kept
    assert [r.status_code for r in wrong] == [400] * 5
    assert "list of token ids" in wrong[1].json()["error"]
    assert (
        outside.status_code == 400
        and "ids[0] holds 1000000000, outside the vocabulary" in outside.json()["error"]
    )


async def test_tei_decode_on_a_backend_without_a_tokenizer_says_so(e5):
    async with embedder_http(e5) as served, httpx.AsyncClient(base_url=served.url) as client:
        answer = await client.post("/decode", json={"ids": [1, 2]})
    assert answer.status_code == 400 and "/decode is unavailable" in answer.json()["error"]


async def test_the_http_port_closes_idle_connections_and_caps_them(tiny_bge_m3):
    # The gate serve's REST port has (dwsearch.common.connections): an idle connection is
    # closed at the header deadline, and beyond the cap a new one is answered 503 and closed.
    from dwsearch.common.connections import ConnectionLimits

    limits = ConnectionLimits(max_connections=2, header_timeout=0.5, body_timeout=0.5)
    async with embedder_http(tiny_bge_m3, connections=limits) as served:
        host, port = served.url.removeprefix("http://").split(":")
        loop = asyncio.get_running_loop()
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
        await asyncio.sleep(0.1)
        refused_reader, refused_writer = await asyncio.open_connection(host, int(port))
        answer = await asyncio.wait_for(refused_reader.read(), 2)
        assert answer.startswith(b"HTTP/1.1 503 ")
        refused_writer.close()
        started = loop.time()
        for reader, writer in idle:
            assert await asyncio.wait_for(reader.read(), 3) == b""  # closed by the server
            writer.close()
        assert loop.time() - started < 2
        async with httpx.AsyncClient(base_url=served.url) as http:  # room again
            assert (await http.get("/health")).status_code == 200


async def test_info_reports_the_inputs_waiting_on_each_lane(e5):
    backend = GatedEmbedding(e5)
    async with embedder_http(backend) as served, httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        stub = pb_grpc.EmbedderServiceStub(served.channel)
        idle = await stub.Info(pb.EmbedderServiceInfoRequest())
        assert (idle.queued_interactive, idle.queued_bulk) == (0, 0)
        backend.hold()
        running = asyncio.ensure_future(client.post("/embed", json={"inputs": ["first, held"]}))
        assert await asyncio.to_thread(backend.started.wait, 10)
        queries = asyncio.ensure_future(client.post("/embed", json={"inputs": ["a query", "another"]}))
        # the bulk lane's worker takes the first window (and is held too); the second waits
        bulk = [
            asyncio.ensure_future(client.post("/embed", json={"inputs": ["window 0"], "priority": "bulk"}))
        ]
        await asyncio.sleep(0.5)
        bulk.append(
            asyncio.ensure_future(client.post("/embed", json={"inputs": ["window 1"], "priority": "bulk"}))
        )

        async def queued() -> tuple[int, int]:
            info = await stub.Info(pb.EmbedderServiceInfoRequest())
            return info.queued_interactive, info.queued_bulk

        deadline = asyncio.get_running_loop().time() + 10
        while await queued() != (2, 1):
            assert asyncio.get_running_loop().time() < deadline, await queued()
            await asyncio.sleep(0.05)
        backend.gate.set()
        assert all(r.status_code == 200 for r in await asyncio.gather(running, queries, *bulk))


async def test_hugging_face_s_inference_client_and_tei_s_other_routes_match_grpc(tiny_bge_m3):
    from huggingface_hub import AsyncInferenceClient

    async with embedder_http(tiny_bge_m3) as served, httpx.AsyncClient(base_url=served.url) as client:
        expected = dense(await grpc_embed(served, TEXTS))
        # Hugging Face's own client posts {"inputs", "parameters"} to the base URL: POST /.
        hf = AsyncInferenceClient(base_url=served.url)
        for text, want in zip(TEXTS, expected, strict=True):
            got = await hf.feature_extraction(text)
            # One text against it in a batch of several: equal up to float rounding (the
            # matrix kernels differ with the batch's shape, by 1e-7 on an AMD EPYC).
            np.testing.assert_allclose(np.asarray(got, dtype=np.float32).reshape(-1), want, atol=1e-6)
        raw = await hf.feature_extraction(TEXTS[0], normalize=False)
        assert abs(float(np.linalg.norm(raw)) - 1) > 1e-3  # its parameters are honoured
        # SageMaker's /invocations and OpenAI's route without /v1 answer as their twins.
        invocations = await client.post("/invocations", json={"inputs": TEXTS})
        embeddings = await client.post("/embeddings", json={"input": TEXTS})
        twice = await client.post(
            "/", json={"inputs": "x", "normalize": True, "parameters": {"normalize": False}}
        )
        health = [(await client.get(path)).status_code for path in ("/health", "/ping", "/")]
    # The same batch, to float rounding: on an AMD EPYC with AVX-512 (x86-vnni) the same batch's kernels
    # differed run to run by 2e-7.
    np.testing.assert_allclose(np.array(invocations.json(), dtype=np.float32), expected, atol=1e-6)
    np.testing.assert_allclose(
        np.array([d["embedding"] for d in embeddings.json()["data"]], dtype=np.float32), expected, atol=1e-6
    )
    assert twice.status_code == 400 and "give it once" in twice.json()["error"]
    assert health == [200, 200, 200]


# --- Cohere's embed API ---------------------------------------------------------------


def cohere_v1(served, api_key: str = "unused") -> cohere.AsyncClient:
    return cohere.AsyncClient(api_key=api_key, base_url=served.url)


def cohere_v2(served, api_key: str = "unused") -> cohere.AsyncClientV2:
    return cohere.AsyncClientV2(api_key=api_key, base_url=served.url)


async def test_cohere_sdk_v1_and_v2_embed_match_grpc(tiny_bge_m3):
    async with embedder_http(tiny_bge_m3) as served:
        model = served.engine.info.model_id
        floats = await cohere_v1(served).embed(texts=TEXTS, model=model, input_type="search_document")
        by_type = await cohere_v1(served).embed(
            texts=TEXTS, model=model, input_type="search_document", embedding_types=["float"]
        )
        v2 = await cohere_v2(served).embed(
            texts=TEXTS, model=model, input_type="search_document", embedding_types=["float"]
        )
        # The synchronous clients, as a notebook uses them (off the loop that serves them).
        sync_v1 = await asyncio.to_thread(
            cohere.Client(api_key="unused", base_url=served.url).embed,
            texts=TEXTS, model=model, input_type="search_document",
        )  # fmt: skip
        sync_v2 = await asyncio.to_thread(
            cohere.ClientV2(api_key="unused", base_url=served.url).embed,
            texts=TEXTS, model=model, input_type="search_document", embedding_types=["float"],
        )  # fmt: skip
        expected = await grpc_embed(served, TEXTS, input_type=pb.INPUT_TYPE_DOCUMENT)
    want = dense(expected)
    assert floats.response_type == "embeddings_floats" and by_type.response_type == "embeddings_by_type"
    for got in (floats.embeddings, by_type.embeddings.float_, v2.embeddings.float_):
        # The same batch, to float rounding (run to run on an AMD EPYC: 2e-7).
        np.testing.assert_allclose(np.array(got, dtype=np.float32), want, atol=1e-6)
    np.testing.assert_allclose(np.array(sync_v1.embeddings, dtype=np.float32), want, atol=1e-6)
    np.testing.assert_allclose(np.array(sync_v2.embeddings.float_, dtype=np.float32), want, atol=1e-6)
    assert floats.texts == v2.texts == TEXTS and floats.id and v2.id
    assert by_type.embeddings.int8 is None and v2.embeddings.base64 is None
    assert floats.meta.api_version.version == "1" and v2.meta.api_version.version == "2"
    assert v2.meta.billed_units.input_tokens == expected.total_tokens > 0


async def test_cohere_input_types_pick_the_query_or_document_prefix(e5):
    """search_query (and classification, clustering: e5's symmetric tasks) is e5's `query: `
    prefix, search_document its `passage: `; no input_type is a document, as gRPC's unset."""
    async with embedder_http(e5) as served:
        client = cohere_v2(served)

        async def v2(input_type: str) -> np.ndarray:
            answer = await client.embed(
                texts=TEXTS, model="", input_type=input_type, embedding_types=["float"]
            )
            return np.array(answer.embeddings.float_, dtype=np.float32)

        queries, documents = await v2("search_query"), await v2("search_document")
        classification, clustering = await v2("classification"), await v2("clustering")
        unset = await cohere_v1(served).embed(texts=TEXTS)
        want_queries = dense(await grpc_embed(served, TEXTS, input_type=pb.INPUT_TYPE_QUERY))
        want_documents = dense(await grpc_embed(served, TEXTS, input_type=pb.INPUT_TYPE_DOCUMENT))
    np.testing.assert_allclose(queries, want_queries, atol=1e-6)
    np.testing.assert_allclose(documents, want_documents, atol=1e-6)
    np.testing.assert_allclose(classification, want_queries, atol=1e-6)
    np.testing.assert_allclose(clustering, want_queries, atol=1e-6)
    np.testing.assert_allclose(np.array(unset.embeddings, dtype=np.float32), want_documents, atol=1e-6)
    assert float(np.abs(queries - documents).max()) > 1e-3  # the prefixes differ


@pytest.mark.parametrize("backend", ["tiny_bge_m3", "e5"])
async def test_cohere_a_texts_vector_is_the_same_alone_and_in_a_batch(backend, request):
    async with embedder_http(request.getfixturevalue(backend)) as served:
        client = cohere_v2(served)
        batch = await client.embed(
            texts=TEXTS, model="", input_type="search_query", embedding_types=["float"]
        )
        alone = [
            (
                await client.embed(
                    texts=[text], model="", input_type="search_query", embedding_types=["float"]
                )
            ).embeddings.float_[0]
            for text in TEXTS
        ]
        v1_alone = [(await cohere_v1(served).embed(texts=[text])).embeddings[0] for text in TEXTS]
        v1_batch = await cohere_v1(served).embed(texts=TEXTS)
    np.testing.assert_allclose(
        np.array(alone, dtype=np.float32), np.array(batch.embeddings.float_, dtype=np.float32), atol=1e-5
    )
    np.testing.assert_allclose(
        np.array(v1_alone, dtype=np.float32), np.array(v1_batch.embeddings, dtype=np.float32), atol=1e-5
    )


async def test_cohere_embedding_types_base64_and_the_sign_bits(tiny_bge_m3):
    from sentence_transformers.util.quantization import quantize_embeddings

    async with embedder_http(tiny_bge_m3) as served:
        answer = await cohere_v2(served).embed(
            texts=TEXTS, model="", input_type="search_document",
            embedding_types=["float", "base64", "binary", "ubinary"],
        )  # fmt: skip
        v1 = await cohere_v1(served).embed(texts=TEXTS[:1], embedding_types=["ubinary"])
        with pytest.raises(cohere.BadRequestError) as int8:
            await cohere_v2(served).embed(
                texts=TEXTS, model="", input_type="search_document", embedding_types=["float", "int8"]
            )
    floats = np.array(answer.embeddings.float_, dtype=np.float32)
    decoded = np.array([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in answer.embeddings.base64])
    np.testing.assert_array_equal(decoded, floats)
    dimension = served.engine.info.dimension
    np.testing.assert_array_equal(np.array(answer.embeddings.ubinary), quantize_embeddings(floats, "ubinary"))
    np.testing.assert_array_equal(np.array(answer.embeddings.binary), quantize_embeddings(floats, "binary"))
    assert len(answer.embeddings.binary[0]) == -(-dimension // 8)
    assert v1.embeddings.ubinary == answer.embeddings.ubinary[:1] and v1.embeddings.float_ is None
    assert "'int8' is not supported" in int8.value.body["message"]
    assert "float, base64, binary, ubinary" in int8.value.body["message"]


@pytest.mark.parametrize(
    "path,body,status,message",
    [
        ("/v1/embed", {}, 400, "texts is required"),
        ("/v2/embed", {"texts": []}, 400, "texts is empty"),
        ("/v1/embed", {"texts": ["ok", ""]}, 400, "input 1 is empty"),
        ("/v1/embed", {"texts": "one string"}, 400, "a list of strings"),
        ("/v1/embed", {"texts": ["x"] * 9}, 413, "9 inputs, over the limit of 8"),
        ("/v2/embed", {"texts": ["x"], "model": "embed-v4.0"}, 404, "does not serve model 'embed-v4.0'"),
        ("/v2/embed", {"texts": ["x"], "embedding_types": ["uint8"]}, 400, "'uint8' is not supported"),
        ("/v2/embed", {"texts": ["x"], "embedding_types": []}, 400, "embedding_types must be"),
        ("/v1/embed", {"images": ["data:image/png;base64,AAAA"]}, 400, "embeds text only"),
        ("/v2/embed", {"texts": ["x"], "input_type": "image"}, 400, "embeds text only"),
        ("/v2/embed", {"texts": ["x"], "input_type": "query"}, 400, "input_type must be one of"),
        ("/v2/embed", {"texts": ["x"], "truncate": "START"}, 400, "START is not supported"),
        ("/v2/embed", {"texts": ["x"], "output_dimension": 256}, 400, "does not shorten them"),
        ("/v2/embed", {"texts": ["x"], "max_tokens": 16}, 400, "only the model's own limit"),
        ("/v2/embed", {"texts": ["x"], "priority": -1}, 400, "priority must be 0 or more"),
        (
            "/v2/embed",
            {"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
            400,
            "only text content",
        ),
        ("/v2/embed", {"texts": ["x"], "inputs": []}, 400, "send one of them"),
    ],
)
async def test_cohere_errors_have_coheres_shape(e5, path, body, status, message):
    async with (
        embedder_http(e5, EngineLimits(max_inputs_per_request=8)) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        answer = await client.post(path, json=body)
    assert answer.status_code == status
    assert list(answer.json()) == ["message"] and message in answer.json()["message"]


async def test_cohere_inputs_of_text_truncate_and_sdk_errors(e5):
    async with embedder_http(e5, EngineLimits(max_input_tokens=32), auth_token="s3cret") as served:
        long = " ".join(["word"] * 100)
        client = cohere_v2(served, api_key="s3cret")
        inputs = await client.embed(
            inputs=[{"content": [{"type": "text", "text": text}]} for text in TEXTS],
            model="", input_type="search_document", embedding_types=["float"],
        )  # fmt: skip
        cut = await client.embed(texts=[long], model="", input_type="search_query", embedding_types=["float"])
        expected = await grpc_embed(served, TEXTS, input_type=pb.INPUT_TYPE_DOCUMENT)
        expected_cut = await grpc_embed(served, [long], input_type=pb.INPUT_TYPE_QUERY, truncate=True)
        with pytest.raises(ApiError) as refused:  # 413: no class of its own in the SDK
            await client.embed(
                texts=[long], model="", input_type="search_query", embedding_types=["float"], truncate="NONE"
            )
        with pytest.raises(cohere.UnauthorizedError):
            await cohere_v1(served, api_key="wrong").embed(texts=["x"])
        with pytest.raises(cohere.NotFoundError):
            await cohere_v1(served, api_key="s3cret").embed(texts=["x"], model="embed-english-v3.0")
    np.testing.assert_allclose(
        np.array(inputs.embeddings.float_, dtype=np.float32), dense(expected), atol=1e-6
    )
    np.testing.assert_allclose(
        np.array(cut.embeddings.float_, dtype=np.float32), dense(expected_cut), atol=1e-6
    )
    assert refused.value.status_code == 413 and "over the model's limit" in refused.value.body["message"]
