"""Whether search's query-embedding deadline can be met at all: the embedder measures one
short query's latency at its warm-up and reports it in Info (`query_latency_ms`); a
deadline below it sends every hybrid search to full text. `serve` compares the two when
it starts and each time it refreshes the embedder's model info, sets two gauges, and logs
a warning naming both numbers and the remedies when the deadline is too short."""

from __future__ import annotations

import logging

from dwsearch.clients.embedder import ModelInfo
from dwsearch.common import metrics

log = logging.getLogger(__name__)

REMEDIES = (
    "give the embedder more CPUs (and DWSEARCH_THREADS to match), run it on the ONNX Runtime int8 runtime "
    "(DWSEARCH_EMBED_RUNTIME=onnx, DWSEARCH_QUANTIZE=int8) or on a GPU, or raise DWSEARCH_EMBED_TIMEOUT_MS"
)


class EmbedDeadlineCheck:
    """Compares the embedder's reported query latency with `deadline_s`. Logs on changes
    only (too slow / fast enough again), not on every refresh."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.exceeded = False
        metrics.SEARCH_EMBED_DEADLINE.set(deadline_s)

    def observe(self, info: ModelInfo) -> bool:
        """Record the latency `info` reports; True when it is over the deadline. An
        embedder that reports none (0) changes nothing."""
        if info.query_latency_ms <= 0:
            return self.exceeded
        latency_s = info.query_latency_ms / 1000
        metrics.SEARCH_EMBEDDER_QUERY_LATENCY.set(latency_s)
        exceeded = latency_s > self.deadline_s
        details = {
            "query_latency_ms": round(info.query_latency_ms, 1),
            "embed_timeout_ms": round(self.deadline_s * 1000),
            "model": info.model_id,
            "runtime": info.runtime,
            "device": info.device,
        }
        if exceeded and not self.exceeded:
            log.warning(
                f"the embedder needs {info.query_latency_ms:.0f} ms for one short query (measured at its warm-up), "
                f"more than search's query-embedding deadline of {self.deadline_s * 1000:.0f} ms "
                f"(DWSEARCH_EMBED_TIMEOUT_MS): hybrid and semantic searches will degrade to full text. To fix: "
                f"{REMEDIES}",
                extra=details,
            )
        elif self.exceeded and not exceeded:
            log.info(
                "the embedder's query latency is within search's query-embedding deadline again",
                extra=details,
            )
        self.exceeded = exceeded
        return exceeded
