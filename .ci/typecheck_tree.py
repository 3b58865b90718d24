"""Build build/typecheck/dwsearch: links that give static tools the `dwsearch` import path.

The repository's top level is fixed (server/, embedder/, reranker/), and setup.py maps it to
one package: server/ is `dwsearch`, embedder/ is `dwsearch.embedder`, reranker/ is
`dwsearch.reranker`. The editable install resolves that at run time through an import hook,
which mypy, pyright and editors cannot follow. This tree can: each entry of server/ and the
two model-service folders is a symbolic link, so new files show up without re-running it.

    python .ci/typecheck_tree.py        # then: mypy (pyproject.toml's mypy_path points here)

Editors: add build/typecheck to the analysis path (VS Code / pyright: python.analysis.extraPaths).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck" / "dwsearch"
SUBPACKAGES = ("embedder", "reranker")


def build() -> Path:
    TREE.mkdir(parents=True, exist_ok=True)
    wanted = {entry.name: entry for entry in (ROOT / "server").iterdir() if entry.name != "__pycache__"}
    wanted.update({name: ROOT / name for name in SUBPACKAGES})
    for existing in TREE.iterdir():
        if existing.name not in wanted or not existing.is_symlink():
            existing.unlink()
    for name, target in wanted.items():
        link = TREE / name
        relative = os.path.relpath(target, TREE)
        if link.is_symlink() and os.readlink(link) == relative:
            continue
        if link.is_symlink():
            link.unlink()
        link.symlink_to(relative)
    return TREE


if __name__ == "__main__":
    print(build())
