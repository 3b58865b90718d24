"""A non-editable install (what the Docker images do) ships every package of the tree."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_every_package(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("dwsearch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for package_root, prefix in (
        (ROOT / "server", "dwsearch"),
        (ROOT / "embedder", "dwsearch/embedder"),
        (ROOT / "reranker", "dwsearch/reranker"),
    ):
        for init in package_root.rglob("__init__.py"):
            relative = init.relative_to(package_root)
            if package_root.name == "server" and relative.parts[0] in ("embedder", "reranker"):
                continue
            expected.add(f"{prefix}/{relative.as_posix()}")
    assert sorted(expected - names) == []
    assert "dwsearch/db/migrations/0001_message_embeddings.sql" in names
    assert "dwsearch/db/dev_schema.sql" in names
