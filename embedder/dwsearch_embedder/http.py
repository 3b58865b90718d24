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
- Cohere: `POST /v1/embed` and `POST /v2/embed` (`texts`, or v2's `inputs` of one text each;
  `input_type` search_query / classification / clustering as queries, search_document as
  documents; `embedding_types` float, base64, binary, ubinary; `truncate` END or NONE), as
  the official `cohere` client's `Client.embed` and `ClientV2.embed` send them.

Every request is interactive unless its body says `"priority": "bulk"` (on Cohere's routes
also an integer priority above 0, Cohere's default 0 being the highest); `input_type`
("query" | "document", default document, as gRPC's unset) picks an asymmetric model's
prefix. A request may name a model (`model`) by its id or as configured; none (or, on
TEI's routes, none at all) is the default model.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence

import numpy as np
from starlette.applications import Starlette

from dwsearch.common.errors import FailedPrecondition, InvalidArgument, Kind
from dwsearch.modelserver.batching import Lane
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
    """OpenAI's (and Cohere's) base64 encoding: the float32 values, little-endian, end to end."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


# Cohere's input types: e5's guidance puts classification and clustering on the query
# prefix (symmetric tasks); search_document is a document. "image" is refused.
COHERE_INPUT_TYPES = {
    "search_query": InputType.QUERY,
    "classification": InputType.QUERY,
    "clustering": InputType.QUERY,
    "search_document": InputType.DOCUMENT,
}
# What Cohere's embedding_types this embedder answers: float, its base64, and the sign bits
# (packed 8 to a byte, first dimension in the high bit: sentence-transformers'
# quantize_embeddings). int8 / uint8 are scaled by ranges Cohere calibrates per model; with no
# such calibration here they are refused rather than guessed.
COHERE_EMBEDDING_TYPES = ("float", "base64", "binary", "ubinary")


def cohere_vectors(kind: str, vectors: np.ndarray) -> Json:
    """One of Cohere's embedding types of `vectors` (rows, float32)."""
    if kind == "float":
        return vectors.tolist()
    if kind == "base64":
        return [base64_of(row) for row in vectors]
    packed = np.packbits(vectors > 0, axis=-1)
    if kind == "ubinary":
        return packed.tolist()
    return (packed.astype(np.int16) - 128).tolist()  # binary: the same bits, signed


def cohere_input_type(body: Json) -> InputType:
    value = str_field(body, "input_type", "search_document")
    if value == "image":
        raise InvalidArgument("input_type image: this embedder embeds text only")
    try:
        return COHERE_INPUT_TYPES[value]
    except KeyError:
        raise InvalidArgument(
            f"input_type must be one of {', '.join(COHERE_INPUT_TYPES)}, not {value!r}"
        ) from None


def cohere_embedding_types(body: Json, *, default: list[str] | None) -> list[str] | None:
    """`embedding_types` (None: v1's plain floats answer)."""
    value = body.get("embedding_types")
    if value is None:
        return default
    if not isinstance(value, list) or not value or not all(isinstance(kind, str) for kind in value):
        raise InvalidArgument('embedding_types must be a list of strings, such as ["float"]')
    for kind in value:
        if kind not in COHERE_EMBEDDING_TYPES:
            raise InvalidArgument(
                f"embedding_types: {kind!r} is not supported; this embedder answers "
                f"{', '.join(COHERE_EMBEDDING_TYPES)}"
            )
    return list(dict.fromkeys(value))


def cohere_truncate(body: Json) -> bool:
    """Cohere's `truncate`: END (the default) cuts an over-long text's end, NONE refuses it."""
    value = str_field(body, "truncate", "END").upper()
    if value not in ("END", "NONE"):
        raise InvalidArgument(f"truncate must be END or NONE, not {value!r}: START is not supported")
    return value == "END"


def cohere_lane(body: Json) -> Lane:
    """v2's `priority` is an integer, 0 (Cohere's default, the highest) and up: 0 is the
    interactive lane, anything higher bulk; our own "interactive" / "bulk" work too."""
    value = body.get("priority")
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise InvalidArgument(f"priority must be 0 or more, not {value}")
        return Lane.INTERACTIVE if value == 0 else Lane.BULK
    return lane_field(body)


def cohere_texts(body: Json) -> list[str]:
    """`texts`, or v2's `inputs` when each holds one text content; no images."""
    if body.get("images"):
        raise InvalidArgument("images are not supported: this embedder embeds text only")
    inputs = body.get("inputs")
    if inputs is not None:
        if body.get("texts") is not None:
            raise InvalidArgument("texts and inputs: send one of them")
        if not isinstance(inputs, list):
            raise InvalidArgument("inputs must be a list of objects with content")
        texts = []
        for index, item in enumerate(inputs):
            content = item.get("content") if isinstance(item, dict) else None
            if not (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)):
                raise InvalidArgument(f"inputs[{index}]: each input must have one content item, a text")
            part = content[0]
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidArgument(
                    f"inputs[{index}]: only text content is supported (this embedder embeds text only)"
                )
            texts.append(part["text"])
    else:
        value = body.get("texts")
        if not isinstance(value, list) or not all(isinstance(text, str) for text in value):
            raise InvalidArgument("texts is required: a list of strings")
        texts = value
    if not texts:
        raise InvalidArgument("texts is empty")
    return texts


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
                route(state, "/v1/embed", self.cohere_embed_v1, dialect=Dialect.COHERE),
                route(state, "/v2/embed", self.cohere_embed_v2, dialect=Dialect.COHERE),
            ],
        )

    def _engine(self, body: Json, *, openai: bool = False, cohere: bool = False) -> Embedder:
        model = str_field(body, "model")
        try:
            return self.models.route(model)
        except FailedPrecondition as exc:
            if cohere:
                raise HttpError(404, str(exc), kind=Kind.NOT_FOUND) from None
            if openai:
                raise HttpError(
                    404, str(exc), kind=Kind.NOT_FOUND, error_type="invalid_request_error",
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

    # --- Cohere -------------------------------------------------------------------------

    async def cohere_embed_v1(self, body: Json) -> Json:
        """v1: without `embedding_types`, `embeddings` is the float vectors
        ("embeddings_floats"); with them, an object of each type ("embeddings_by_type")."""
        return await self._cohere_embed(body, version="1")

    async def cohere_embed_v2(self, body: Json) -> Json:
        """v2: `embeddings` is always an object of each type (float unless asked otherwise)."""
        return await self._cohere_embed(body, version="2")

    async def _cohere_embed(self, body: Json, *, version: str) -> Json:
        engine = self._engine(body, cohere=True)
        texts = cohere_texts(body)
        kinds = cohere_embedding_types(body, default=None if version == "1" else ["float"])
        input_type = cohere_input_type(body)
        dimension = engine.info.dimension
        output_dimension = int_field(body, "output_dimension", None)
        if output_dimension is not None and output_dimension != dimension:
            raise InvalidArgument(
                f"output_dimension {output_dimension}: {engine.info.model_id} gives {dimension}-dimensional "
                f"vectors and does not shorten them; leave it out or send {dimension}"
            )
        max_tokens = int_field(body, "max_tokens", None)
        if max_tokens is not None and max_tokens < engine.max_input_tokens:
            raise InvalidArgument(
                f"max_tokens {max_tokens}: only the model's own limit ({engine.max_input_tokens}) is "
                "supported; leave it out"
            )
        result = await engine.embed(
            texts,
            input_type=input_type,
            lane=cohere_lane(body),
            normalize=bool_field(body, "normalize", True),
            truncate=cohere_truncate(body),
        )
        vectors = np.stack([e.dense for e in result.embeddings if e.dense is not None]).astype(np.float32)
        tokens = sum(e.token_count for e in result.embeddings)
        answer: Json = {"id": str(uuid.uuid4()), "texts": texts}
        if kinds is None:
            answer.update(response_type="embeddings_floats", embeddings=vectors.tolist())
        else:
            answer.update(
                response_type="embeddings_by_type",
                embeddings={kind: cohere_vectors(kind, vectors) for kind in kinds},
            )
        answer["meta"] = {"api_version": {"version": version}, "billed_units": {"input_tokens": tokens}}
        return answer

    # --- TEI ----------------------------------------------------------------------------

    def _tei_inputs(self, body: Json) -> list[str]:
        texts = texts_field(body, "inputs")
        if not texts:
            raise HttpError(400, "inputs is empty", kind=Kind.INVALID_ARGUMENT, error_type="Empty")
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
                kind=Kind.FAILED_PRECONDITION,
                error_type="Backend",
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
