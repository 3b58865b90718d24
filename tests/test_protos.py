"""The protos are the contract with the Go team: lint-clean, and the checked-in Python
code is exactly what they generate."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_fresh():
    result = subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_generated_code_check_detects_staleness(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "protos"))
    try:
        import generate
    finally:
        sys.path.pop(0)
    written = generate.generate(tmp_path)
    assert {p.name for p in written} >= {
        f"{n}_pb2.py" for n in ("search", "sweep", "embedder", "reranker", "index")
    }
    stale = tmp_path / "search_pb2.py"
    stale.write_text(stale.read_text() + "\n# edited by hand\n")
    monkeypatch.setattr(generate, "TARGET", tmp_path)
    monkeypatch.setattr(sys, "argv", ["generate.py", "--check"])
    assert generate.main() == 1


@pytest.mark.skipif(
    shutil.which("buf", path=str(Path(sys.executable).parent)) is None, reason="buf-bin not installed"
)
def test_buf_lint_clean():
    buf = shutil.which("buf", path=str(Path(sys.executable).parent))
    result = subprocess.run([buf, "lint"], cwd=ROOT / "protos", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_file_sets_go_package():
    for proto in (ROOT / "protos" / "dwsearch" / "v1").glob("*.proto"):
        assert 'option go_package = "' in proto.read_text(), proto.name
