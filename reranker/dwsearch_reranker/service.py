"""RerankerService over gRPC: protobuf in, the engine's domain call, protobuf out."""

from __future__ import annotations

from dwsearch.common.errors import InvalidArgument
from dwsearch.common.interceptor import deadline_of
from dwsearch.modelserver.batching import Lane
from dwsearch.modelserver.runtime import Context
from dwsearch.v1 import embedder_pb2 as pb_embedder
from dwsearch.v1 import reranker_pb2 as pb
from dwsearch.v1 import reranker_pb2_grpc as pb_grpc
from dwsearch_reranker.engine import Reranker

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RerankerService"].full_name
# A reranked search has a person waiting: unset is interactive.
LANES: dict[int, Lane] = {
    pb_embedder.PRIORITY_UNSPECIFIED: Lane.INTERACTIVE,
    pb_embedder.PRIORITY_INTERACTIVE: Lane.INTERACTIVE,
    pb_embedder.PRIORITY_BULK: Lane.BULK,
}


class RerankerServicer(pb_grpc.RerankerServiceServicer):
    def __init__(self, engine: Reranker) -> None:
        self.engine = engine

    async def Rerank(self, request: pb.RerankRequest, context: Context) -> pb.RerankResponse:
        lane = LANES.get(request.priority)
        if lane is None:
            raise InvalidArgument(f"unknown priority {request.priority}")
        result = await self.engine.rerank(
            request.query,
            request.documents,
            top_n=request.top_n,
            raw_scores=request.raw_scores,
            deadline=deadline_of(context),
            lane=lane,
        )
        return result.to_pb()

    async def Info(
        self, request: pb.RerankerServiceInfoRequest, context: Context
    ) -> pb.RerankerServiceInfoResponse:
        return pb.RerankerServiceInfoResponse(
            **self.engine.info_fields(),
            max_length=self.engine.info.max_length,
            max_documents_per_request=self.engine.limits.max_documents_per_request,
        )
