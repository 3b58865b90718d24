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
        environ={"DWSEARCH_DATABASE_URL": "postgresql://app:hunter2@db:5432/dw", "DWSEARCH_AUTH_TOKEN": "tok-123"},
    )
    shown = repr(cfg) + str(cfg.describe())
    assert "hunter2" not in shown and "tok-123" not in shown
    assert "postgresql://app:***@db:5432/dw" in shown


def test_config_is_frozen():
    cfg = c.load(c.ServerConfig, environ={})
    with pytest.raises(AttributeError):
        cfg.embed_model = "x"  # type: ignore[misc]
