"""A non-editable install, built from what the Docker images copy, ships the whole tree:
every module imports from the installed copy, every source and SQL file is there, and
nothing else is (no module the tree no longer has)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What Dockerfile.server and Dockerfile.embedder COPY into the build stage.
BUILD_CONTEXT = ("pyproject.toml", "README.md", "server", "embedder", "reranker")
# The layout (docs/development.md, docs/architecture.md): each folder holds its packages at their import
# path (server/dwsearch, embedder/dwsearch_embedder, reranker/dwsearch_reranker).
SOURCE_FOLDERS = ("server", "embedder", "reranker")
PACKAGES = ("dwsearch", "dwsearch_embedder", "dwsearch_reranker")

IMPORT_ALL = """
import importlib, importlib.metadata, json, sys
site = sys.argv[1]
(dist,) = importlib.metadata.distributions(name="dwsearch", path=[site])
files = sorted(str(f) for f in dist.files if str(f).split("/")[0] in sys.argv[2:])
modules = sorted(f[:-3].replace("/", ".").removesuffix(".__init__") for f in files if f.endswith(".py"))
outside = {}
for name in modules:
    module = importlib.import_module(name)
    if not module.__file__.startswith(site):
        outside[name] = module.__file__
print(json.dumps({"files": files, "modules": modules, "outside": outside}))
"""


def _source_files() -> set[str]:
    """The tree's modules and SQL files, named as an install holds them."""
    found = set()
    for directory in SOURCE_FOLDERS:
        for path in (ROOT / directory).rglob("*"):
            if path.suffix not in (".py", ".sql") or "__pycache__" in path.parts:
                continue
            found.add(path.relative_to(ROOT / directory).as_posix())
    return found


def test_an_install_from_the_image_context_ships_and_imports_every_module(tmp_path):
    context = tmp_path / "context"
    context.mkdir()
    for name in BUILD_CONTEXT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, context / name)
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "--target", str(site),
         str(context)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr

    # The installed copy comes first on the path, ahead of the editable install's finder.
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, str(site), *PACKAGES],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    installed = json.loads(result.stdout.strip().splitlines()[-1])
    assert installed["outside"] == {}  # every module came from the install
    assert "dwsearch.cli" in installed["modules"] and "dwsearch_embedder.main" in installed["modules"]
    shipped = {f for f in installed["files"] if f.endswith((".py", ".sql"))}
    assert sorted(_source_files() - shipped) == []  # nothing of the tree left out
    assert sorted(shipped - _source_files()) == []  # nothing that is not in the tree


def test_the_package_map_names_every_package_and_module():
    """dwsearch's docstring lists every subpackage and top-level module, and the
    model-service packages."""
    import dwsearch

    package = ROOT / "server" / "dwsearch"
    names = {f"dwsearch.{path.stem}" for path in package.glob("*.py") if path.stem != "__init__"}
    names |= {f"dwsearch.{path.parent.name}" for path in package.glob("*/__init__.py")}
    names |= {"dwsearch_embedder", "dwsearch_reranker"}
    missing = sorted(name for name in names if f"- {name} " not in dwsearch.__doc__)
    assert missing == []
