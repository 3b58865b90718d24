from pathlib import Path

import pytest

from dwsearch.common import config as c


def test_defaults_then_env_then_overrides():
    env = {"DWSEARCH_EMBED_MODEL": "env-model", "DWSEARCH_EMBED_TIMEOUT_MS": "450", "DWSEARCH_RERANK": "yes"}
    cfg = c.load(c.ServerConfig, {"embed_model": "flag-model", "listen_addr": None}, environ=env)
    assert cfg.embed_model == "flag-model"  # flag beats env
    assert cfg.embed_timeout_ms == 450  # env beats default
    assert cfg.rerank is True
    assert cfg.listen_addr == "[::]:50051"  # a None override keeps env/default


def test_types_are_parsed():
    env = {"DWSEARCH_DATA_DIR": "~/x", "DWSEARCH_GRACE_SECONDS": "2.5", "DWSEARCH_REDACT": "off"}
    cfg = c.load(c.ServerConfig, environ=env)
    assert cfg.data_dir == Path("~/x").expanduser()
    assert cfg.grace_seconds == 2.5
    assert cfg.redact is False


@pytest.mark.parametrize("name,value", [("DWSEARCH_REDACT", "maybe"), ("DWSEARCH_DB_POOL_MAX", "ten")])
def test_bad_env_value_names_the_variable(name, value):
    with pytest.raises(SystemExit, match=name):
        c.load(c.ServerConfig, environ={name: value})


def test_secrets_are_masked():
    cfg = c.load(
        c.ServerConfig,
        environ={
            "DWSEARCH_DATABASE_URL": "postgresql://app:hunter2@db:5432/dw",
            "DWSEARCH_AUTH_TOKEN": "tok-123",
        },
    )
    shown = repr(cfg) + str(cfg.describe())
    assert "hunter2" not in shown and "tok-123" not in shown
    assert "postgresql://app:***@db:5432/dw" in shown


def test_config_is_frozen():
    cfg = c.load(c.ServerConfig, environ={})
    with pytest.raises(AttributeError):
        cfg.embed_model = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    "variable,value,allowed",
    [
        ("DWSEARCH_KNN_INDEX", "hnws", "exact, hnsw"),
        ("DWSEARCH_LOG_FORMAT", "jsno", "json, text"),
        ("DWSEARCH_LOG_LEVEL", "verbose", "debug, info, warning, error, critical"),
    ],
)
def test_an_enum_like_setting_with_a_typo_is_refused_naming_the_value_and_the_choices(
    variable, value, allowed
):
    from dwsearch.common.config import ServerConfig, load

    with pytest.raises(SystemExit, match=rf"invalid {variable} .*'{value}'; expected one of {allowed}"):
        load(ServerConfig, environ={variable: value})


@pytest.mark.parametrize(
    "cls_name,variable,value",
    [
        ("EmbedderConfig", "DWSEARCH_EMBED_BACKEND", "bge_m3"),
        ("EmbedderConfig", "DWSEARCH_EMBED_RUNTIME", "ort"),
        ("EmbedderConfig", "DWSEARCH_QUANTIZE", "int4"),
        ("RerankerConfig", "DWSEARCH_DTYPE", "fp16"),
    ],
)
def test_model_service_enums_are_checked_too(cls_name, variable, value):
    from dwsearch.common import config

    with pytest.raises(SystemExit, match=f"invalid {variable}"):
        config.load(getattr(config, cls_name), environ={variable: value})


def test_a_flag_with_a_typo_is_refused_by_the_parser(capsys):
    from dwsearch.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--knn-index", "hnws"])
    assert "invalid choice: 'hnws'" in capsys.readouterr().err
