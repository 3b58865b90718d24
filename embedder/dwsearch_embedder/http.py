"""The embedder's HTTP APIs (DWSEARCH_HTTP_PORT), on the engines gRPC's EmbedderService
uses (the routes, tokens, errors and drain they share: dwsearch.modelserver.http):

- OpenAI: `POST /v1/embeddings` (`input` a string or a list of strings; `encoding_format`
  float, or base64 of little-endian float32 as OpenAI sends it; `dimensions` only the
  model's own; `usage` the engine's token counts), `GET /v1/models`.
- TEI (text-embeddings-inference): `POST /embed` (`inputs`, `truncate`, `normalize`),
  `POST /embed_sparse` (bge-m3's lexical weights as `[{index, value}]`), `POST /tokenize`
  (`inputs`, `add_special_tokens`: ids, text and character offsets, for the backends on a
  Hugging Face tokenizer: bge-m3, sentence-transformers), `POST /decode` (`ids`, a list of
  token ids or of such lists, `skip_special_tokens`: one string each; the same backends),
  `GET /info`,
  `GET /health`; and TEI's other names: `POST /` and `/invocations` (SageMaker) embed, as
  Hugging Face's `InferenceClient.feature_extraction` sends them (`parameters` nested),
  `POST /embeddings` is OpenAI's route, `GET /ping` and `GET /` are health.

Every request is interactive unless its body says `"priority": "bulk"`; `input_type`
("query" | "document", default document, as gRPC's unset) picks an asymmetric model's
prefix. A request may name a model (`model`) by its id or as configured; none (or, on
TEI's routes, none at all) is the default model.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import grpc
import numpy as np
from starlette.applications import Starlette

from dwsearch.common.errors import FailedPrecondition, InvalidArgument
from dwsearch.modelserver.http import (
    Dialect,
    HttpError,
    HttpState,
    Json,
    bad_request,
    bool_field,
    hf_parameters,
    http_app,
    int_field,
    lane_field,
    route,
    str_field,
    texts_field,
)
from dwsearch_embedder.backends.base import InputType
from dwsearch_embedder.engine import Embedder, EmbedResult
from dwsearch_embedder.service import ServedModels

OWNED_BY = "dwsearch"


def input_type_field(body: Json) -> InputType:
    value = str_field(body, "input_type", "document")
    try:
        return InputType(value)
    except ValueError:
        raise InvalidArgument(f"input_type must be query or document, not {value!r}") from None


def base64_of(vector: np.ndarray) -> str:
    """OpenAI's base64 encoding: the float32 values, little-endian, end to end."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


class EmbedderHttp:
    """The routes over one embedder process's engines (the default first)."""

    def __init__(self, engines: Embedder | Sequence[Embedder], state: HttpState) -> None:
        self.models = ServedModels(engines)
        self.state = state

    def app(self) -> Starlette:
        state = self.state
        return http_app(
            state,
            [
                route(state, "/v1/embeddings", self.openai_embeddings, dialect=Dialect.OPENAI),
                route(state, "/v1/models", self.openai_models, dialect=Dialect.OPENAI, method="GET"),
                route(state, "/embed", self.tei_embed, dialect=Dialect.TEI),
                route(state, "/embed_sparse", self.tei_embed_sparse, dialect=Dialect.TEI),
                route(state, "/tokenize", self.tei_tokenize, dialect=Dialect.TEI),
                route(state, "/decode", self.tei_decode, dialect=Dialect.TEI),
                route(state, "/info", self.tei_info, dialect=Dialect.TEI, method="GET"),
                # TEI's other names for embed: `POST /` (Hugging Face's InferenceClient posts
                # there), SageMaker's /invocations, and OpenAI's route without /v1.
                route(state, "/", self.tei_compat, dialect=Dialect.TEI),
                route(state, "/invocations", self.tei_compat, dialect=Dialect.TEI),
                route(state, "/embeddings", self.openai_embeddings, dialect=Dialect.OPENAI),
            ],
        )

    def _engine(self, body: Json, *, openai: bool = False) -> Embedder:
        model = str_field(body, "model")
        try:
            return self.models.route(model)
        except FailedPrecondition as exc:
            if openai:
                raise HttpError(
                    404, str(exc), code=grpc.StatusCode.NOT_FOUND, kind="invalid_request_error",
                    error_code="model_not_found",
                ) from None  # fmt: skip
            raise

    async def _embed(
        self, engine: Embedder, body: Json, texts: list[str], *, sparse: bool = False
    ) -> EmbedResult:
        return await engine.embed(
            texts,
            input_type=input_type_field(body),
            lane=lane_field(body),
            dense=not sparse,
            sparse=sparse,
            normalize=bool_field(body, "normalize", True),
            truncate=bool_field(body, "truncate", False),
        )

    # --- OpenAI -------------------------------------------------------------------------

    async def openai_embeddings(self, body: Json) -> Json:
        engine = self._engine(body, openai=True)
        texts = texts_field(body, "input")
        encoding = str_field(body, "encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise bad_request(
                f"encoding_format must be float or base64, not {encoding!r}", error_code="invalid_value"
            )
        dimensions = int_field(body, "dimensions", None)
        dimension = engine.info.dimension
        if dimensions is not None and dimensions != dimension:
            raise bad_request(
                f"dimensions {dimensions}: {engine.info.model_id} gives {dimension}-dimensional vectors and "
                "does not shorten them; leave dimensions out or send "
                f"{dimension}",
                error_code="invalid_value",
            )
        result = await self._embed(engine, body, texts)
        data = []
        for index, embedding in enumerate(result.embeddings):
            assert embedding.dense is not None  # asked for
            vector: Json = base64_of(embedding.dense) if encoding == "base64" else embedding.dense.tolist()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(e.token_count for e in result.embeddings)
        return {
            "object": "list",
            "data": data,
            "model": result.model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    async def openai_models(self, _: Json) -> Json:
        return {
            "object": "list",
            "data": [
                {"id": model_id, "object": "model", "created": 0, "owned_by": OWNED_BY}
                for model_id in self.models.model_ids
            ],
        }

    # --- TEI ----------------------------------------------------------------------------

    def _tei_inputs(self, body: Json) -> list[str]:
        texts = texts_field(body, "inputs")
        if not texts:
            raise HttpError(400, "inputs is empty", code=grpc.StatusCode.INVALID_ARGUMENT, kind="Empty")
        direction = str_field(body, "truncation_direction", "Right")
        if direction.lower() != "right":
            raise InvalidArgument("truncation_direction: only Right is supported")
        if body.get("prompt_name") is not None:
            raise InvalidArgument("prompt_name is not supported; send input_type (query or document)")
        return texts

    async def tei_embed(self, body: Json) -> Json:
        engine = self._engine(body)
        texts = self._tei_inputs(body)
        dimensions = int_field(body, "dimensions", None)
        if dimensions is not None and dimensions != engine.info.dimension:
            raise InvalidArgument(
                f"dimensions {dimensions}: {engine.info.model_id} gives {engine.info.dimension}-dimensional vectors"
            )
        result = await self._embed(engine, body, texts)
        out = []
        for embedding in result.embeddings:
            assert embedding.dense is not None  # asked for
            out.append(embedding.dense.tolist())
        return out

    async def tei_compat(self, body: Json) -> Json:
        """`POST /` and `/invocations`: embed, the parameters as TEI's own route takes them
        or nested as Hugging Face's clients send them (`{"inputs", "parameters"}`)."""
        return await self.tei_embed(hf_parameters(body))

    async def tei_embed_sparse(self, body: Json) -> Json:
        engine = self._engine(body)
        texts = self._tei_inputs(body)
        info = engine.info
        if not info.sparse_supported:
            raise HttpError(
                424,
                f"{info.model_id} has no sparse output (/embed_sparse needs a model with a sparse head, "
                "such as bge-m3); use /embed for dense vectors",
                code=grpc.StatusCode.FAILED_PRECONDITION,
                kind="Backend",
            )
        result = await self._embed(engine, body, texts, sparse=True)
        out = []
        for embedding in result.embeddings:
            weights = embedding.sparse or {}
            out.append([{"index": int(i), "value": float(weights[i])} for i in sorted(weights)])
        return out

    async def tei_tokenize(self, body: Json) -> Json:
        engine = self._engine(body)
        texts = self._tei_inputs(body)
        tokens = await engine.tokenize(
            texts, add_special_tokens=bool_field(body, "add_special_tokens", True), lane=lane_field(body)
        )
        return [
            [
                {"id": t.id, "text": t.text, "special": t.special, "start": t.start, "stop": t.stop}
                for t in each
            ]
            for each in tokens
        ]

    async def tei_decode(self, body: Json) -> Json:
        """TEI's /decode: `ids` (a list of token ids, or a list of them) as text, one string each."""
        ids = body.get("ids")
        if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            ids = [ids]
        if not (
            isinstance(ids, list)
            and ids
            and all(
                isinstance(each, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in each)
                for each in ids
            )
        ):
            raise InvalidArgument("ids must be a list of token ids, or a list of such lists")
        engine = self._engine(body)
        return await engine.decode(
            ids, skip_special_tokens=bool_field(body, "skip_special_tokens", True), lane=lane_field(body)
        )

    async def tei_info(self, _: Json) -> Json:
        engine = self.models.engines[0]
        info = engine.info
        limits = engine.limits
        return {
            "model_id": info.model_id,
            "model_sha": info.revision or None,
            "model_dtype": info.dtype,
            "model_type": {"embedding": {"pooling": "cls" if info.backend == "bge-m3" else "mean"}},
            "max_concurrent_requests": limits.max_queue,
            "max_input_length": engine.max_input_tokens,
            "max_batch_tokens": limits.max_batch_tokens,
            "max_batch_requests": limits.max_batch_inputs,
            "max_client_batch_size": limits.max_inputs_per_request,
            "auto_truncate": False,
            "tokenization_workers": 1,
            "version": "dwsearch",
            # Ours, beside TEI's fields.
            "dimension": info.dimension,
            "sparse_supported": info.sparse_supported,
            "backend": info.backend,
            "runtime": info.runtime,
            "device": info.device,
            "served_models": self.models.model_ids,
        }
