"""Chat search's settings: one frozen object instead of a long constructor (serve builds it
from ServerConfig, `SearchSettings.from_config`; tests name only what they change)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dwsearch.common.config import ServerConfig
from dwsearch.redaction import REDACTION_OFF, Redaction
from dwsearch.search.ftsplan import FTS_ORG_FIRST_MAX_EVENTS
from dwsearch.search.fusion import DEFAULT_METHOD, LEXICAL_POWER, weight_of
from dwsearch.search.profiles import DEFAULT_PROFILE, FusionProfile, profile_for


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """`models`: the active models (ServerConfig.models), the first the Index's and the
    sweep's default; hybrid and semantic search run a dense leg per model, and a sparse leg
    where the model has sparse vectors. `redaction`: applied to a query before it is
    embedded or reranked. `hnsw`: queries shaped for the opt-in HNSW index per model
    (DWSEARCH_KNN_INDEX=hnsw). `fusion`, `fusion_weights`, `lexical_power`: the server's
    fusion (its models' fusion profile, `profile`, under DWSEARCH_FUSION and
    DWSEARCH_FUSION_WEIGHTS), which a request may override."""

    models: tuple[str, ...]
    embed_timeout: float
    rerank_timeout: float
    rerank_by_default: bool = False
    redaction: Redaction = REDACTION_OFF
    hnsw: bool = False
    fts_org_first_max_events: int = FTS_ORG_FIRST_MAX_EVENTS
    fusion: str = DEFAULT_METHOD
    fusion_weights: Mapping[str, float] = field(default_factory=dict)
    lexical_power: float = LEXICAL_POWER
    profile: FusionProfile = DEFAULT_PROFILE
    lexical: bool = False
    """Hybrid's lexical leg runs (DWSEARCH_LEXICAL_LEG; auto: where the weights give it any)."""

    def __post_init__(self) -> None:
        names = self.models
        if not names or not all(names) or len(set(names)) != len(names):
            raise ValueError(f"search needs distinct, non-empty model names; got {names!r}")

    def describe_fusion(self) -> dict[str, object]:
        """The server's fusion as serve logs it at start and the console's Models page shows
        it: the profile (its name and where its figures come from) and what is served."""
        return {
            **self.profile.describe(),
            "method": str(self.fusion),
            "weights": ",".join(f"{k}={v:g}" for k, v in sorted(self.fusion_weights.items())),
            "lexical_leg": "on" if self.lexical else "off",
        }

    @classmethod
    def from_config(
        cls, config: ServerConfig, *, fusion_weights: Mapping[str, float], redaction: Redaction
    ) -> SearchSettings:
        """`fusion_weights`: DWSEARCH_FUSION_WEIGHTS parsed (serve.fusion_weights)."""
        models = tuple(config.models)  # a dense (and sparse) leg per active model
        profile = profile_for(models)
        weights = {**profile.weights, **fusion_weights}
        lexical = config.lexical_leg == "on" or (
            config.lexical_leg == "auto" and weight_of("lexical", weights) > 0
        )
        return cls(
            models=models,
            embed_timeout=config.embed_timeout_ms / 1000,
            rerank_timeout=config.rerank_timeout_ms / 1000,
            rerank_by_default=config.rerank,
            redaction=redaction,
            hnsw=config.knn_index == "hnsw",
            fts_org_first_max_events=config.fts_org_first_max_events,
            fusion=profile.method if config.fusion == "profile" else config.fusion,
            fusion_weights=weights,
            lexical_power=profile.lexical_power,
            profile=profile,
            lexical=lexical,
        )
