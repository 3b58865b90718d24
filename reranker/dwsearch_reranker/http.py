"""The reranker's HTTP APIs (DWSEARCH_HTTP_PORT), on the engine gRPC's RerankerService
uses (routes, tokens, errors and drain: dwsearch.modelserver.http):

- Cohere / Jina: `POST /v1/rerank` (and Cohere's `/v2/rerank`; `query`, `documents` as strings or objects with
  `text`, `top_n`, `return_documents`) answers `results` of `index` and `relevance_score`
  (sigmoid scores, as gRPC's), best first.
- TEI (text-embeddings-inference): `POST /rerank` (`query`, `texts`, `return_text`,
  `raw_scores`, `truncate`) answers `[{index, score[, text]}]`, best first; `GET /info`,
  `GET /health`; TEI's other names: `POST /` and `/invocations` (SageMaker) rerank,
  `GET /ping` and `GET /` are health.

Every request is interactive unless its body says `"priority": "bulk"`.
"""

from __future__ import annotations

import uuid

from starlette.applications import Starlette

from dwsearch.common.errors import InvalidArgument, Kind
from dwsearch.modelserver.http import (
    Dialect,
    HttpError,
    HttpState,
    Json,
    bool_field,
    hf_parameters,
    http_app,
    int_field,
    lane_field,
    route,
    str_field,
)
from dwsearch_reranker.engine import Reranker


def documents_field(body: Json) -> list[str]:
    """Cohere's `documents`: strings, or objects whose `text` is the document."""
    value = body.get("documents")
    if not isinstance(value, list):
        raise InvalidArgument("documents is required: a list of strings or of objects with a text field")
    out = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            out.append(item["text"])
        else:
            raise InvalidArgument(f"documents[{index}] must be a string or an object with a text string")
    return out


def top_n_field(body: Json, count: int) -> int:
    top_n = int_field(body, "top_n", None)
    if top_n is None:
        return 0
    if top_n < 1:
        raise InvalidArgument(f"top_n must be at least 1, not {top_n}")
    return min(top_n, count)


class RerankerHttp:
    def __init__(self, engine: Reranker, state: HttpState) -> None:
        self.engine = engine
        self.state = state

    def app(self) -> Starlette:
        state = self.state
        return http_app(
            state,
            [
                route(state, "/v1/rerank", self.cohere_rerank, dialect=Dialect.COHERE),
                route(state, "/v2/rerank", self.cohere_rerank, dialect=Dialect.COHERE),
                route(state, "/rerank", self.tei_rerank, dialect=Dialect.TEI),
                route(state, "/info", self.tei_info, dialect=Dialect.TEI, method="GET"),
                # TEI's other names for a reranker's rerank: `POST /` and SageMaker's /invocations.
                route(state, "/", self.tei_compat, dialect=Dialect.TEI),
                route(state, "/invocations", self.tei_compat, dialect=Dialect.TEI),
            ],
        )

    async def tei_compat(self, body: Json) -> Json:
        """`POST /` and `/invocations`: rerank, the fields as /rerank takes them or nested
        in `parameters` as Hugging Face's clients send theirs."""
        return await self.tei_rerank(hf_parameters(body))

    def _check_model(self, body: Json) -> None:
        model = str_field(body, "model")
        info = self.engine.info
        if model and model != info.model_id:
            raise HttpError(
                404,
                f"this reranker does not serve model {model!r}; it serves {info.model_id}",
                kind=Kind.NOT_FOUND,
            )

    async def cohere_rerank(self, body: Json) -> Json:
        self._check_model(body)
        query = str_field(body, "query")
        documents = documents_field(body)
        rank_fields = body.get("rank_fields")
        if rank_fields is not None and rank_fields != ["text"]:
            raise InvalidArgument("rank_fields: only the documents' text is ranked")
        result = await self.engine.rerank(
            query,
            documents,
            top_n=top_n_field(body, len(documents)),
            raw_scores=bool_field(body, "raw_scores", False),
            lane=lane_field(body),
        )
        return_documents = bool_field(body, "return_documents", False)
        results = []
        for index, score in result.ranked:
            item: Json = {"index": index, "relevance_score": score}
            if return_documents:
                item["document"] = {"text": documents[index]}
            results.append(item)
        return {
            "id": str(uuid.uuid4()),
            "results": results,
            "model": result.model_id,
            "meta": {"api_version": {"version": "1"}, "billed_units": {"search_units": 1}},
        }

    async def tei_rerank(self, body: Json) -> Json:
        self._check_model(body)
        query = str_field(body, "query")
        texts = body.get("texts")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise InvalidArgument("texts is required: a list of strings")
        if not texts:
            raise HttpError(400, "texts is empty", kind=Kind.INVALID_ARGUMENT, error_type="Empty")
        if str_field(body, "truncation_direction", "Right").lower() != "right":
            raise InvalidArgument("truncation_direction: only Right is supported")
        # Pairs longer than the model's max_length are always cut (as gRPC's Rerank): TEI's
        # `truncate` is accepted either way.
        bool_field(body, "truncate", False)
        result = await self.engine.rerank(
            query, texts, raw_scores=bool_field(body, "raw_scores", False), lane=lane_field(body)
        )
        return_text = bool_field(body, "return_text", False)
        out = []
        for index, score in result.ranked:
            item: Json = {"index": index, "score": score}
            if return_text:
                item["text"] = texts[index]
            out.append(item)
        return out

    async def tei_info(self, _: Json) -> Json:
        engine = self.engine
        info = engine.info
        limits = engine.limits
        return {
            "model_id": info.model_id,
            "model_sha": info.revision or None,
            "model_dtype": info.dtype,
            "model_type": {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
            "max_concurrent_requests": limits.max_queue,
            "max_input_length": info.max_length,
            "max_batch_tokens": limits.max_batch_tokens,
            "max_batch_requests": limits.max_batch_inputs,
            "max_client_batch_size": limits.max_documents_per_request,
            "auto_truncate": True,
            "tokenization_workers": 1,
            "version": "dwsearch",
            "runtime": info.runtime,
            "device": info.device,
        }
