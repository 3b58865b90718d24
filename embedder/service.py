"""EmbedderService over gRPC: protobuf in, the engine's domain calls, protobuf out.
Errors are raised as domain exceptions; the shared interceptor maps them to statuses."""

from __future__ import annotations

import grpc

from dwsearch.common.batching import Lane
from dwsearch.common.errors import InvalidArgument
from dwsearch.common.grpcserver import deadline_of
from dwsearch.embedder.backends.base import InputType
from dwsearch.embedder.engine import Embedder
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EmbedderService"].full_name
_INPUT_TYPES = {
    pb.INPUT_TYPE_UNSPECIFIED: InputType.DOCUMENT,
    pb.INPUT_TYPE_QUERY: InputType.QUERY,
    pb.INPUT_TYPE_DOCUMENT: InputType.DOCUMENT,
}
# PRIORITY_UNSPECIFIED is left to the engine: it follows the input type.
LANES = {
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


class EmbedderServicer(pb_grpc.EmbedderServiceServicer):
    def __init__(self, engine: Embedder) -> None:
        self.engine = engine

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        result = await self.engine.embed(
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

    async def CountTokens(
        self, request: pb.CountTokensRequest, context: grpc.aio.ServicerContext
    ) -> pb.CountTokensResponse:
        counts = await self.engine.count_tokens(
            request.inputs, input_type=input_type_of(request.input_type), deadline=deadline_of(context)
        )
        return pb.CountTokensResponse(token_counts=counts, max_input_tokens=self.engine.max_input_tokens)

    async def Info(
        self, request: pb.EmbedderServiceInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.EmbedderServiceInfoResponse:
        info = self.engine.info
        return pb.EmbedderServiceInfoResponse(
            model_id=info.model_id,
            revision=info.revision,
            backend=info.backend,
            dimension=info.dimension,
            max_input_tokens=self.engine.max_input_tokens,
            sparse_supported=info.sparse_supported,
            sparse_dimension=info.sparse_dimension,
            device=info.device,
            dtype=info.dtype,
            max_batch_tokens=self.engine.limits.max_batch_tokens,
            max_inputs_per_request=self.engine.limits.max_inputs_per_request,
            runtime=info.runtime,
            query_latency_ms=self.engine.query_latency_s * 1000,
        )
