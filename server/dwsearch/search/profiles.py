"""Fusion profiles: how Search fuses its legs for each model configuration it may serve.

The weights that make hybrid search better than semantic search alone are a property of the
models served together: on bench.quality's dev part one model alone wants the lexical leg
at a quarter of a dense leg squared, another at a quarter as it is, an English-only model
at a full dense leg, and two models fused want it not at all. So each configuration (one model, or a
set served together, in any order) has its profile here, beside the models' names: the
method, the weight of every kind of leg, and how the lexical leg's share is taken.

serve picks the profile of DWSEARCH_EMBED_MODELS at start and logs it; DWSEARCH_FUSION and
DWSEARCH_FUSION_WEIGHTS override its method and weights, and a request's fusion and
fusion_weights override those. A configuration without a profile gets DEFAULT_PROFILE (the
fusion module's defaults). `measured` says where a profile's figures come from: bench.quality
on these machines (chosen on the set's dev part, reported on its test part: docs/search.md,
"Fusion profiles"), or, for a model whose weights are not on these machines, reasoned from
published figures and marked so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dwsearch.retrieval.fusion import Fusion
from dwsearch.search.fusion import DEFAULT_METHOD, DEFAULT_WEIGHTS, LEXICAL_POWER, SOURCES

# The models with a profile (the ids serve and the windows know them by).
USE = "use-multilingual-v3"
E5_SMALL = "intfloat/multilingual-e5-small"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
BGE_M3 = "BAAI/bge-m3"


@dataclass(frozen=True)
class FusionProfile:
    """How one model configuration fuses: `method`, a weight for every kind of leg
    (`weights`: fts, lexical, dense, sparse) and the power the lexical leg's share of the
    query's score is taken to (`lexical_power`, weighted fusion only). `models`: the
    configuration (empty: the default for any other). `measured`: where the figures come
    from."""

    name: str
    models: frozenset[str]
    method: str
    weights: Mapping[str, float]
    lexical_power: float
    measured: str
    reasoned: bool = False
    """True when the profile was not measured on these machines (reasoned from published
    figures)."""

    def __post_init__(self) -> None:
        if self.method not in (Fusion.RRF, Fusion.WEIGHTED):
            raise ValueError(f"fusion profile {self.name!r}: method {self.method!r}")
        if set(self.weights) != set(SOURCES):
            raise ValueError(f"fusion profile {self.name!r}: a weight for each of {', '.join(SOURCES)}")
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))

    @property
    def lexical(self) -> bool:
        """Whether the profile gives the lexical leg any weight (the leg runs by default)."""
        return self.weights["lexical"] > 0

    def describe(self) -> dict[str, object]:
        """The profile as serve logs it and the console shows it."""
        return {
            "profile": self.name,
            "method": str(self.method),
            "weights": ",".join(f"{k}={self.weights[k]:g}" for k in SOURCES),
            "lexical_power": self.lexical_power,
            "measured": self.measured,
        }


def _weights(*, fts: float, lexical: float, dense: float = 1.0, sparse: float = 1.0) -> dict[str, float]:
    return {"fts": fts, "lexical": lexical, "dense": dense, "sparse": sparse}


MEASURED = "bench.quality, chosen on the dev part (bench/results/quality.json, x86-avx2)"

DEFAULT_PROFILE = FusionProfile(
    name="default",
    models=frozenset(),
    method=DEFAULT_METHOD,
    weights=DEFAULT_WEIGHTS,
    lexical_power=LEXICAL_POWER,
    measured="no profile for these models: the fusion module's defaults (the lexical leg off)",
)


def _measured(*models: str, method: str, lexical: float, lexical_power: float) -> FusionProfile:
    """A profile bench.quality chose on its dev part: full text at half a dense leg, dense
    and sparse legs at 1, the lexical leg as given; named by its models joined by "+"."""
    return FusionProfile(
        name="+".join(models),
        models=frozenset(models),
        method=method,
        weights=_weights(fts=0.5, lexical=lexical),
        lexical_power=lexical_power,
        measured=MEASURED,
    )


PROFILES: tuple[FusionProfile, ...] = (
    _measured(USE, method=Fusion.WEIGHTED, lexical=0.25, lexical_power=2.0),
    _measured(E5_SMALL, method=Fusion.WEIGHTED, lexical=0.25, lexical_power=1.0),
    _measured(MINILM, method=Fusion.WEIGHTED, lexical=1.0, lexical_power=1.0),
    _measured(USE, E5_SMALL, method=Fusion.RRF, lexical=0.0, lexical_power=1.0),
    # bge-m3's weights are not on these machines. Its paper (Chen et al. 2024, table 1)
    # reports MIRACL nDCG@10 67.8 for dense alone, 53.9 for sparse alone and 68.9 for
    # dense + sparse scored as 1 × dense + 0.3 × sparse: the sparse leg at 0.3 of the dense
    # one. Its sparse weights already match the query's words, so the lexical leg is left
    # off; full text keeps the default half weight (exact identifiers).
    FusionProfile(
        name=BGE_M3,
        models=frozenset({BGE_M3}),
        method=Fusion.WEIGHTED,
        weights=_weights(fts=0.5, lexical=0.0, sparse=0.3),
        lexical_power=LEXICAL_POWER,
        measured="not measured here: dense 1, sparse 0.3 as the bge-m3 paper's dense + sparse "
        "(MIRACL nDCG@10 68.9 against 67.8 dense alone); fts and lexical the defaults",
        reasoned=True,
    ),
)


def profile_for(models: Iterable[str]) -> FusionProfile:
    """The profile of the configuration serving `models` (in any order); DEFAULT_PROFILE
    when none is registered."""
    wanted = frozenset(models)
    for profile in PROFILES:
        if profile.models == wanted:
            return profile
    return DEFAULT_PROFILE
