"""The reranker's domain object: validates a request, admits it by a cheap size bound,
tokenizes its pairs on one tokenizer thread, scores them through the shared batcher's
inference thread (both in two lanes, interactive first), and orders the documents best
first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dwsearch.common.admission import Admission, LaneExecutor, chunks, precut
from dwsearch.common.batching import Batcher, Lane, prior_overhead_tokens
from dwsearch.common.errors import Internal, InvalidArgument, Unavailable
from dwsearch.embedder.runtime import StartupError
from dwsearch.reranker.backends.base import PreparedPair, RerankBackend, RerankerInfo
from dwsearch.v1 import reranker_pb2 as pb

log = logging.getLogger(__name__)

WARM_UP = ("warm-up query", ["a short passage to run the model once before serving"])


@dataclass(frozen=True)
class RerankLimits:
    max_batch_tokens: int = 16384
    max_batch_inputs: int = 256
    max_queue: int = 1024
    max_documents_per_request: int = 512
    max_queue_tokens: int = 262_144
    max_request_bytes: int = 8 * 1024 * 1024
    bulk_batch_ms: float = 0.0  # 0 = no time cap on bulk batches


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


class Reranker:
    def __init__(self, backend: RerankBackend, limits: RerankLimits = RerankLimits()) -> None:
        if limits.max_documents_per_request > limits.max_queue:
            raise StartupError(
                f"max_documents_per_request ({limits.max_documents_per_request}) exceeds max_queue ({limits.max_queue})"
            )
        self.backend = backend
        self.limits = limits
        self._info: RerankerInfo | None = None
        self._admission = Admission(
            "reranker", max_queue_tokens=limits.max_queue_tokens, max_request_bytes=limits.max_request_bytes
        )
        self._tokenizer = LaneExecutor("reranker-tokenizer")
        self._batcher: Batcher[PreparedPair, float] | None = None  # made once the device is known

    @property
    def info(self) -> RerankerInfo:
        if self._info is None:
            raise Unavailable("the reranker is still loading its model")
        return self._info

    async def start(self) -> None:
        """Load the model and score one warm-up pair."""
        info = await asyncio.to_thread(self.backend.load)
        self._batcher = Batcher(
            "reranker",
            self._run,
            max_batch_tokens=self.limits.max_batch_tokens,
            max_batch_inputs=self.limits.max_batch_inputs,
            max_queue=self.limits.max_queue,
            prior_overhead_tokens=prior_overhead_tokens(info.device),
            bulk_batch_seconds=self.limits.bulk_batch_ms / 1000,
            # On a CPU a query runs beside the bulk batch in flight, sharing the cores,
            # instead of waiting for it: one long bulk input (a chat window on a full-size
            # model) takes several query times. A GPU runs one batch at a time anyway.
            interactive_worker=info.device == "cpu",
        )
        self._batcher.start()
        self._info = info
        await self.rerank(*WARM_UP)
        log.info(
            "model ready",
            extra={
                "model_id": self._info.model_id,
                "revision": self._info.revision,
                "device": self._info.device,
                "dtype": self._info.dtype,
                "max_length": self._info.max_length,
            },
        )

    async def stop(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()
        self._tokenizer.shutdown()

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
            raise InvalidArgument(
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
            pairs: list[PreparedPair] = []
            for part in chunks(documents):
                pairs += await self._tokenizer.run(
                    lambda part=part: self.backend.prepare(query, documents[part]),
                    lane=lane,
                    deadline=deadline,
                )
            assert self._batcher is not None  # made before the model is reported loaded
            logits = np.asarray(
                await self._batcher.submit(pairs, [p.length for p in pairs], deadline=deadline, lane=lane),
                dtype=np.float32,
            )
        scores = logits.astype(np.float64) if raw_scores else sigmoid(logits)
        order = np.argsort(-scores, kind="stable")
        if top_n:
            order = order[:top_n]
        return RerankResult([(int(i), float(scores[i])) for i in order], info.model_id)

    def _run(self, pairs: Sequence[PreparedPair]) -> list[float | Exception]:
        logits = self.backend.score(pairs)
        out: list[float | Exception] = []
        for pair, logit in zip(pairs, logits.tolist(), strict=True):
            if np.isfinite(logit):
                out.append(logit)
                continue
            # The text is never logged: it may hold personal data.
            log.error(
                "model produced a non-finite score",
                extra={"model_id": self.info.model_id, "tokens": pair.length},
            )
            out.append(Internal("the model produced a non-finite score for a document"))
        return out
