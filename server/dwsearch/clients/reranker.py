"""RerankerService client."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from dwsearch.clients.channel import ServiceUnavailable, auth_metadata, open_channel, translate
from dwsearch.clients.embedder import PRIORITIES
from dwsearch.common.tls import ClientTls
from dwsearch.v1 import reranker_pb2 as pb
from dwsearch.v1 import reranker_pb2_grpc as pb_grpc

SERVICE = "dwsearch.v1.RerankerService"


class RerankerClient:
    """Calls a RerankerService; errors as EmbedderClient's."""

    def __init__(
        self, target: str, *, timeout: float = 10.0, auth_token: str = "", tls: ClientTls | None = None
    ) -> None:
        if not target:
            raise ServiceUnavailable("reranker: no address configured")
        self.target = target
        self.timeout = timeout
        self._metadata = auth_metadata(auth_token)
        self._channel = open_channel(target, [SERVICE], tls)
        self._stub = pb_grpc.RerankerServiceStub(self._channel)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int = 0,
        raw_scores: bool = False,
        priority: str = "interactive",
        timeout: float | None = None,
    ) -> list[tuple[int, float]]:
        """(document index, score) pairs, best first. `priority`: "interactive" (a person
        waits: search, agent context) or "bulk"."""
        request = pb.RerankRequest(
            query=query,
            documents=list(documents),
            top_n=top_n,
            raw_scores=raw_scores,
            priority=PRIORITIES[priority],
        )
        try:
            response = await self._stub.Rerank(
                request, timeout=timeout or self.timeout, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, "reranker") from exc
        return [(r.index, r.score) for r in response.results]

    async def info(self, *, timeout: float | None = None) -> pb.RerankerServiceInfoResponse:
        """The reranker's description: its model, runtime and the runtime's report (CPU
        class, quantization)."""
        try:
            response: pb.RerankerServiceInfoResponse = await self._stub.Info(
                pb.RerankerServiceInfoRequest(), timeout=timeout or self.timeout, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, "reranker") from exc
        return response

    async def close(self) -> None:
        await self._channel.close()
