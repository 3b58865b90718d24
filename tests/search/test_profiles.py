"""Fusion profiles (dwsearch.search.profiles): each model configuration's fusion, picked by
serve at start from its models, under DWSEARCH_FUSION / DWSEARCH_FUSION_WEIGHTS, with the
lexical leg on wherever the weights give it any (DWSEARCH_LEXICAL_LEG=auto)."""

from __future__ import annotations

import pytest

from dwsearch.common.config import ServerConfig, load
from dwsearch.redaction import REDACTION_OFF
from dwsearch.search.fusion import SOURCES, parse_weights
from dwsearch.search.profiles import (
    BGE_M3,
    DEFAULT_PROFILE,
    E5_SMALL,
    MINILM,
    PROFILES,
    USE,
    FusionProfile,
    profile_for,
)
from dwsearch.search.settings import SearchSettings


def settings(**environ: str) -> SearchSettings:
    config = load(ServerConfig, environ=environ)
    return SearchSettings.from_config(
        config, fusion_weights=parse_weights(config.fusion_weights), redaction=REDACTION_OFF
    )


def test_every_profile_weighs_every_leg_and_says_where_its_figures_come_from():
    assert len({p.models for p in PROFILES}) == len(PROFILES)  # one per configuration
    for profile in (*PROFILES, DEFAULT_PROFILE):
        assert set(profile.weights) == set(SOURCES)
        assert profile.measured
        with pytest.raises(TypeError):
            profile.weights["fts"] = 2.0  # type: ignore[index]
    (reasoned,) = [p for p in PROFILES if p.reasoned]
    assert reasoned.models == {BGE_M3} and "not measured here" in reasoned.measured
    assert reasoned.weights["sparse"] == 0.3 and not reasoned.lexical


def test_a_profile_needs_a_known_method_and_every_weight():
    with pytest.raises(ValueError, match="method"):
        FusionProfile("x", frozenset({"m"}), "borda", dict.fromkeys(SOURCES, 1.0), 1.0, "t")
    with pytest.raises(ValueError, match="a weight for each"):
        FusionProfile("x", frozenset({"m"}), "rrf", {"fts": 1.0}, 1.0, "t")


def test_the_profile_of_a_configuration_is_found_whatever_the_order_of_its_models():
    assert profile_for([USE]).name == USE
    assert profile_for([E5_SMALL, USE]) is profile_for([USE, E5_SMALL])
    assert profile_for([USE, E5_SMALL]).models == {USE, E5_SMALL}
    assert profile_for([MINILM]).lexical
    assert profile_for(["some/other-model"]) is DEFAULT_PROFILE
    assert profile_for([USE, "some/other-model"]) is DEFAULT_PROFILE


def test_serve_takes_its_models_profile_and_runs_the_lexical_leg_where_it_weighs():
    use = settings(DWSEARCH_EMBED_MODEL=USE)
    profile = profile_for([USE])
    assert use.profile is profile and use.fusion == profile.method
    assert use.fusion_weights == dict(profile.weights) and use.lexical_power == profile.lexical_power
    assert use.lexical  # auto, and the profile gives it weight
    described = use.describe_fusion()
    assert described["profile"] == USE and described["lexical_leg"] == "on"
    assert described["measured"] == profile.measured and "lexical=0.25" in str(described["weights"])

    unknown = settings(DWSEARCH_EMBED_MODEL="some/other-model")
    assert unknown.profile is DEFAULT_PROFILE and not unknown.lexical  # the defaults: the leg off
    assert unknown.describe_fusion()["lexical_leg"] == "off"


def test_the_server_settings_override_the_profile():
    weighted = settings(DWSEARCH_EMBED_MODELS=f"{USE},{E5_SMALL}")
    assert weighted.fusion == "rrf" and not weighted.lexical
    overridden = settings(
        DWSEARCH_EMBED_MODELS=f"{USE},{E5_SMALL}",
        DWSEARCH_FUSION="weighted",
        DWSEARCH_FUSION_WEIGHTS="lexical=0.3",
    )
    assert overridden.fusion == "weighted" and overridden.fusion_weights["lexical"] == 0.3
    assert (
        overridden.fusion_weights["fts"] == profile_for([USE, E5_SMALL]).weights["fts"]
    )  # unnamed: the profile's
    assert overridden.lexical  # auto follows the weights served
    assert not settings(DWSEARCH_EMBED_MODEL=USE, DWSEARCH_FUSION_WEIGHTS="lexical=0").lexical
    assert not settings(DWSEARCH_EMBED_MODEL=USE, DWSEARCH_LEXICAL_LEG="off").lexical
    assert settings(DWSEARCH_EMBED_MODEL="some/other-model", DWSEARCH_LEXICAL_LEG="on").lexical
