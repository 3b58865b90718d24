"""EmbedderService over gRPC: protobuf in, the engine's domain calls, protobuf out.
Errors are raised as domain exceptions; the shared interceptor maps them to statuses."""

from __future__ import annotations

from collections.abc import Sequence

from dwsearch.common.errors import FailedPrecondition, InvalidArgument
from dwsearch.common.interceptor import deadline_of
from dwsearch.modelserver.batching import Lane
from dwsearch.modelserver.runtime import Context
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_embedder.backends.base import InputType
from dwsearch_embedder.engine import Embedder

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EmbedderService"].full_name
_INPUT_TYPES: dict[int, InputType] = {
    pb.INPUT_TYPE_UNSPECIFIED: InputType.DOCUMENT,
    pb.INPUT_TYPE_QUERY: InputType.QUERY,
    pb.INPUT_TYPE_DOCUMENT: InputType.DOCUMENT,
}
# PRIORITY_UNSPECIFIED is left to the engine: it follows the input type.
LANES: dict[int, Lane | None] = {
    pb.PRIORITY_UNSPECIFIED: None,
    pb.PRIORITY_INTERACTIVE: Lane.INTERACTIVE,
    pb.PRIORITY_BULK: Lane.BULK,
}


def input_type_of(value: int) -> InputType:
    try:
        return _INPUT_TYPES[value]
    except KeyError:
        raise InvalidArgument(f"unknown input_type {value}") from None


def lane_of(value: int) -> Lane | None:
    try:
        return LANES[value]
    except KeyError:
        raise InvalidArgument(f"unknown priority {value}") from None


class ServedModels:
    """The engines of one embedder process, the default (first) one answering requests that
    name no model. A request names a model by the model id Info reports, or as it is
    configured (DWSEARCH_EMBED_MODELS: a hub id or a directory)."""

    def __init__(self, engines: Embedder | Sequence[Embedder]) -> None:
        self.engines = [engines] if isinstance(engines, Embedder) else list(engines)
        if not self.engines:
            raise ValueError("an embedder serves at least one model")

    @property
    def model_ids(self) -> list[str]:
        """Every model's id, the default first (Unavailable while one is still loading)."""
        return [engine.info.model_id for engine in self.engines]

    def route(self, model: str) -> Embedder:
        if not model:
            return self.engines[0]
        for engine in self.engines:
            if model == engine.name or (engine.loaded and model == engine.info.model_id):
                return engine
        served = ", ".join(self.model_ids)  # Unavailable while loading: the model may yet be one of them
        raise FailedPrecondition(f"this embedder does not serve model {model!r}; it serves {served}")


class EmbedderServicer(pb_grpc.EmbedderServiceServicer):
    """`engines`: one engine, or several (the first is the default; see ServedModels)."""

    def __init__(self, engines: Embedder | Sequence[Embedder]) -> None:
        self.models = ServedModels(engines)

    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        result = await self.models.route(request.model).embed(
            request.inputs,
            input_type=input_type_of(request.input_type),
            lane=lane_of(request.priority),
            dense=request.dense if request.HasField("dense") else True,
            sparse=request.sparse,
            normalize=request.normalize if request.HasField("normalize") else True,
            truncate=request.truncate,
            deadline=deadline_of(context),
        )
        return result.to_pb()

    async def CountTokens(self, request: pb.CountTokensRequest, context: Context) -> pb.CountTokensResponse:
        engine = self.models.route(request.model)
        counts = await engine.count_tokens(
            request.inputs, input_type=input_type_of(request.input_type), deadline=deadline_of(context)
        )
        return pb.CountTokensResponse(token_counts=counts, max_input_tokens=engine.max_input_tokens)

    async def Info(
        self, request: pb.EmbedderServiceInfoRequest, context: Context
    ) -> pb.EmbedderServiceInfoResponse:
        engine = self.models.route(request.model)
        info = engine.info
        return pb.EmbedderServiceInfoResponse(
            **engine.info_fields(),
            backend=info.backend,
            dimension=info.dimension,
            max_input_tokens=engine.max_input_tokens,
            sparse_supported=info.sparse_supported,
            sparse_dimension=info.sparse_dimension,
            max_inputs_per_request=engine.limits.max_inputs_per_request,
            query_latency_ms=engine.query_latency_s * 1000,
            served_models=self.models.model_ids,
        )
