import subprocess
import sys

import pytest

COMMANDS = ["serve", "embedder", "reranker", "sweep", "purge", "forget", "sweep-status", "retry-poison", "migrate", "dev", "demo"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command):
    result = subprocess.run(
        [sys.executable, "-m", "dwsearch.cli", command, "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert f"usage: dwsearch {command}" in result.stdout
    assert "DWSEARCH_" in result.stdout  # every flag names its environment variable


def test_no_command_is_an_error():
    result = subprocess.run([sys.executable, "-m", "dwsearch.cli"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "COMMAND" in result.stderr
