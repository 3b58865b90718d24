"""Package layout for setuptools; everything else is in pyproject.toml.

The top-level layout is fixed: server/ is the `dwsearch` package (CLI, config, shared
gRPC bootstrap, generated protos, search / sweep / index), embedder/ and reranker/ are its
model-service subpackages. Every directory with an __init__.py under those roots ships.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
PACKAGE_DIRS = {"dwsearch": "server", "dwsearch.embedder": "embedder", "dwsearch.reranker": "reranker"}


def packages() -> list[str]:
    found = []
    for name, directory in PACKAGE_DIRS.items():
        base = ROOT / directory
        for init in sorted(base.rglob("__init__.py")):
            parts = init.parent.relative_to(base).parts
            if name == "dwsearch" and parts and f"dwsearch.{parts[0]}" in PACKAGE_DIRS:
                continue  # mapped to its own root
            found.append(".".join([name, *parts]))
    return found


setup(packages=packages(), package_dir=PACKAGE_DIRS)
