""".ci/image_context.py rebuilds a Dockerfile's build context as `docker build` sends it:
the check in .ci/deploy-checks that installs each image's extra from it must fail when a
COPY source is left out by .dockerignore (setup.py once was)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "image_context.py"


def run(dockerfile: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(dockerfile), str(dest)], capture_output=True, text=True
    )


def tree(tmp_path: Path, dockerignore: str) -> Path:
    src = tmp_path / "repo"
    (src / "server" / "__pycache__").mkdir(parents=True)
    (src / "server" / "__init__.py").write_text("")
    (src / "server" / "__pycache__" / "x.pyc").write_text("")
    (src / "tests").mkdir()
    (src / "tests" / "t.py").write_text("")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        (src / name).write_text(name)
    (src / ".dockerignore").write_text(dockerignore)
    (src / "Dockerfile").write_text(
        "FROM python AS build\nWORKDIR /src\nCOPY pyproject.toml setup.py README.md ./\nCOPY server ./server\n"
        "FROM python\nCOPY --from=build /opt/venv /opt/venv\n"
    )
    return src


def test_a_copy_source_dockerignore_leaves_out_fails(tmp_path):
    src = tree(tmp_path, "*\n!pyproject.toml\n!README.md\n!server/\n")
    result = run(src / "Dockerfile", tmp_path / "ctx")
    assert result.returncode == 1
    assert "COPY setup.py: not in the build context" in result.stderr


def test_the_context_holds_exactly_what_the_copy_lines_and_dockerignore_allow(tmp_path):
    src = tree(tmp_path, "*\n!pyproject.toml\n!setup.py\n!README.md\n!server/\n**/__pycache__\n")
    result = run(src / "Dockerfile", tmp_path / "ctx")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "ctx" / "src")
    files = sorted(
        p.relative_to(tmp_path / "ctx").as_posix() for p in (tmp_path / "ctx").rglob("*") if p.is_file()
    )
    assert files == ["src/README.md", "src/pyproject.toml", "src/server/__init__.py", "src/setup.py"]


def test_both_images_contexts_of_this_repository_build_the_package(tmp_path):
    for dockerfile in ("Dockerfile.server", "Dockerfile.embedder"):
        result = run(ROOT / dockerfile, tmp_path / dockerfile)
        assert result.returncode == 0, result.stderr
        ctx = Path(result.stdout.strip())
        for name in (
            "pyproject.toml",
            "server/dwsearch/cli.py",
            "server/dwsearch/db/migrations",
            "embedder/dwsearch_embedder/__init__.py",
            "reranker/dwsearch_reranker/__init__.py",
        ):
            assert (ctx / name).exists(), f"{dockerfile}: {name} not in the build context"
        assert not list(ctx.rglob("__pycache__"))
