"""Why an answer is less than asked for: the reasons chat search and the Index share (each
named after the proto's DEGRADATION_REASON_* value)."""

from __future__ import annotations

import enum


class Degradation(enum.Enum):
    """Why an answer is less than the request asked for. Members are named after the
    proto's DEGRADATION_REASON_* values (dwsearch.v1.DegradationReason)."""

    SEMANTIC_DISABLED = "semantic_disabled"
    EMBEDDER_UNAVAILABLE = "embedder_unavailable"
    EMBEDDER_TIMEOUT = "embedder_timeout"
    RERANKER_UNAVAILABLE = "reranker_unavailable"
    RERANKER_TIMEOUT = "reranker_timeout"
    RERANKER_NOT_CONFIGURED = "reranker_not_configured"
    # IndexService only: SPARSE or HYBRID asked of a model without sparse vectors.
    SPARSE_UNSUPPORTED = "sparse_unsupported"
