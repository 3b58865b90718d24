"""The reranker's domain object: what is its own in the shared model-server runtime
(dwsearch.modelserver.runtime): validating a Rerank request, tokenizing its pairs, scoring
them, ordering the documents best first, and the warm-up."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dwsearch.common.errors import InvalidArgument
from dwsearch.modelserver.admission import OverLimit, precut
from dwsearch.modelserver.batching import Lane
from dwsearch.modelserver.runtime import ModelEngine, ModelLimits
from dwsearch.v1 import reranker_pb2 as pb
from dwsearch_reranker.backends.base import PreparedPair, RerankBackend, RerankerInfo

WARM_UP = ("warm-up query", ["a short passage to run the model once before serving"])


@dataclass(frozen=True)
class RerankLimits(ModelLimits):
    max_documents_per_request: int = 512
    # bulk_batch_ms 0 = no time cap on bulk batches


@dataclass(frozen=True)
class RerankResult:
    """(document index, score) pairs, best first."""

    ranked: list[tuple[int, float]]
    model_id: str

    def to_pb(self) -> pb.RerankResponse:
        return pb.RerankResponse(
            results=[pb.RerankResult(index=i, score=s) for i, s in self.ranked], model_id=self.model_id
        )


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Scores in [0, 1], as FlagReranker(normalize=True), TEI and CrossEncoder give them."""
    return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))


class Reranker(ModelEngine[RerankerInfo, PreparedPair, float]):
    service = "reranker"

    def __init__(self, backend: RerankBackend, limits: RerankLimits = RerankLimits()) -> None:
        super().__init__(limits, per_request=("max_documents_per_request", limits.max_documents_per_request))
        self.backend = backend
        self.limits: RerankLimits = limits

    def _load(self) -> RerankerInfo:
        return self.backend.load()

    async def _warm_up(self) -> dict[str, Any]:
        await self.rerank(*WARM_UP)
        return {"max_length": self.info.max_length}

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int = 0,
        raw_scores: bool = False,
        deadline: float | None = None,
        lane: Lane = Lane.INTERACTIVE,
    ) -> RerankResult:
        """Documents best first (ties keep request order), the best `top_n` (0 = all);
        sigmoid scores unless `raw_scores`."""
        info = self.info
        if not query:
            raise InvalidArgument("query is empty")
        if not documents:
            raise InvalidArgument("documents is empty")
        if len(documents) > self.limits.max_documents_per_request:
            raise OverLimit(
                f"{len(documents)} documents, over the limit of {self.limits.max_documents_per_request} per request"
            )
        # Every pair holds the query (cut to 3/4 of max_length) and one document, at most
        # max_length tokens in all.
        max_pair = self.info.max_length
        query = precut(query, max_pair)
        documents = [precut(document, max_pair) for document in documents]
        query_tokens = min(len(query.encode("utf-8", "surrogatepass")), max_pair * 3 // 4)
        with self._admission.admit(
            [query, *documents], max_tokens_each=max_pair, extra_tokens=query_tokens * (len(documents) - 1)
        ):
            pairs = await self._tokenize(
                documents, lambda part: self.backend.prepare(query, part), lane=lane, deadline=deadline
            )
            logits = np.asarray(
                await self.batcher.submit(pairs, [p.length for p in pairs], deadline=deadline, lane=lane),
                dtype=np.float32,
            )
        scores = logits.astype(np.float64) if raw_scores else sigmoid(logits)
        order = np.argsort(-scores, kind="stable")
        if top_n:
            order = order[:top_n]
        return RerankResult([(int(i), float(scores[i])) for i in order], info.model_id)

    def _run(self, pairs: Sequence[PreparedPair]) -> list[float | Exception]:
        logits = self.backend.score(pairs)
        return [
            logit if np.isfinite(logit) else self._non_finite("score for a document", pair.length)
            for pair, logit in zip(pairs, logits.tolist(), strict=True)
        ]
