"""Names Search (dwsearch.search) and the Index (dwsearch.index) share: the reasons an
answer is less than asked for, and how long an embedder's model info is trusted. Both
import them from here, so the index never imports search (their fusion primitives are
dwsearch.common.fusion)."""

from __future__ import annotations

import enum

# How long a successful embedder Info is trusted before it is asked again (a redeploy
# with another model must be noticed).
MODEL_INFO_TTL_S = 60.0


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
