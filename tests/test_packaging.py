"""Every Python package in the tree is listed in pyproject.toml, so a non-editable install
(the Docker images) ships all of it."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOTS = {"dwsearch": ROOT / "server", "dwsearch.embedder": ROOT / "embedder", "dwsearch.reranker": ROOT / "reranker"}


def test_every_package_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert config["package-dir"] == {k: str(v.relative_to(ROOT)) for k, v in ROOTS.items()}
    found = set()
    for name, directory in ROOTS.items():
        for init in directory.rglob("__init__.py"):
            relative = init.parent.relative_to(directory)
            if relative.parts and relative.parts[0] in ("embedder", "reranker") and name == "dwsearch":
                continue
            found.add(".".join([name, *relative.parts]))
    assert sorted(found - listed) == []
