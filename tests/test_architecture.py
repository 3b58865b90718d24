"""The import rule of docs/architecture.md ("Import rule"), checked on the source.

Imports go one way: transport (gRPC servicers, REST, CLIs) -> domain (searcher, sweeper,
index) -> adapters (store modules, clients, db) -> dwsearch.common. The features (search,
sweep, index) do not import one another, and the model services (dwsearch_embedder,
dwsearch_reranker) import neither the server's features nor each other.

A static scan of the package's source (ast, nothing imported), so the rule holds for
imports inside functions and under `if TYPE_CHECKING:` too: a type-only import is still
a dependency a reader (and the module-graph drawers) must follow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each package of the distribution, in the folder its import path names.
PACKAGE_ROOTS = {
    "dwsearch": ROOT / "server" / "dwsearch",
    "dwsearch_embedder": ROOT / "embedder" / "dwsearch_embedder",
    "dwsearch_reranker": ROOT / "reranker" / "dwsearch_reranker",
}
# Generated code (protos/generate.py), never edited by hand: not scanned.
GENERATED = "dwsearch.v1"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (the package when a name is not a module)
    line: int


def module_name(package: str, root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def source_files() -> Iterator[tuple[str, Path]]:
    for package, root in PACKAGE_ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            name = module_name(package, root, path)
            if name == GENERATED or name.startswith(GENERATED + "."):
                continue
            yield name, path


def file_imports(name: str, text: str, *, is_package: bool, modules: set[str]) -> list[Import]:
    """The imports of module `name` (source `text`), relative ones resolved; a `from M
    import n` names M.n when that is a module, else M."""
    found: list[Import] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.extend(Import(name, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append(Import(name, candidate if candidate in modules else base, node.lineno))
    return found


def scan() -> tuple[set[str], list[Import]]:
    files = dict(source_files())
    modules = set(files)
    imports = [
        i
        for name, path in files.items()
        for i in file_imports(
            name, path.read_text(encoding="utf-8"), is_package=path.name == "__init__.py", modules=modules
        )
    ]
    return modules, [i for i in imports if i.target.split(".")[0] in PACKAGE_ROOTS]


MODULES, IMPORTS = scan()


def within(module: str, pattern: str) -> bool:
    """`module` is `pattern` or inside it; `pattern` may hold fnmatch wildcards, one
    dotted component each (e.g. dwsearch.*.service)."""
    parts, wanted = module.split("."), pattern.split(".")
    return len(parts) >= len(wanted) and all(
        fnmatchcase(part, want) for part, want in zip(parts, wanted, strict=False)
    )


# Transport: protobuf or JSON in, a domain call, protobuf or JSON out; and the commands.
TRANSPORT = (
    "dwsearch.*.service",
    "dwsearch.rest",
    "dwsearch.console",
    "dwsearch.sweep.commands",
    "dwsearch_embedder.main",
    "dwsearch_reranker.main",
)
# Composition roots: they wire every layer together and sit above all of them.
ENTRY_POINTS = ("dwsearch.serve", "dwsearch.cli", "dwsearch.stack", "dwsearch.demo", "dwsearch.export_onnx")
# Adapters: SQL and the gRPC clients of the model services.
STORES = (
    "dwsearch.search.store*",
    "dwsearch.sweep.store*",
    "dwsearch.index.store*",
    "dwsearch.retrieval.store*",
)
ADAPTERS = (*STORES, "dwsearch.clients", "dwsearch.db", "dwsearch.flags")
# The domain objects that orchestrate a feature.
ORCHESTRATORS = (
    "dwsearch.search.searcher",
    "dwsearch.search.legs",
    "dwsearch.search.similar",
    "dwsearch.sweep.sweeper",
    "dwsearch.sweep.keyrun",
    "dwsearch.sweep.admin",
    "dwsearch.index.document_index",
    "dwsearch.index.base",
    "dwsearch.index.reads",
    "dwsearch.index.writes",
    "dwsearch.index.context",
)
FEATURES = ("dwsearch.search", "dwsearch.sweep", "dwsearch.index")
SERVER_ONLY = (
    *FEATURES,
    "dwsearch.clients",
    "dwsearch.db",
    "dwsearch.flags",
    "dwsearch.redaction",
    "dwsearch.rest",
    "dwsearch.console",
)


def matches(module: str, patterns: Iterable[str]) -> bool:
    return any(within(module, p) for p in patterns)


@dataclass(frozen=True)
class Rule:
    name: str
    sources: tuple[str, ...]
    forbidden: tuple[str, ...]
    why: str
    # Targets inside `forbidden` that stay allowed, and sources the rule does not cover.
    allowed: tuple[str, ...] = ()
    exempt: tuple[str, ...] = ()

    def covers(self, module: str) -> bool:
        return matches(module, self.sources) and not matches(module, self.exempt)

    def violations(self) -> list[Import]:
        # One line per statement (a from-import of several names is one dependency).
        unique = {(i.source, i.target, i.line): i for i in IMPORTS}.values()
        return [
            i
            for i in unique
            if self.covers(i.source)
            and matches(i.target, self.forbidden)
            and not matches(i.target, self.allowed)
        ]


RULES = (
    Rule(
        "common-is-the-bottom",
        ("dwsearch.common",),
        ("dwsearch",),
        "dwsearch.common is below every other package: it imports only itself (and the generated protos)",
        allowed=("dwsearch.common", GENERATED),
    ),
    Rule(
        "common-does-not-import-the-model-runtime",
        ("dwsearch.common",),
        ("dwsearch.modelserver", "dwsearch_embedder", "dwsearch_reranker"),
        "dwsearch.common is below the model-server runtime too: the server's shared code needs no model code",
    ),
    Rule(
        "the-model-runtime-serves-both-services",
        ("dwsearch.modelserver",),
        ("dwsearch_embedder", "dwsearch_reranker", *SERVER_ONLY, *ENTRY_POINTS),
        "the model-server runtime is below both model services and knows neither, nor the server's features",
    ),
    Rule(
        "the-retrieval-core-is-below-the-features",
        ("dwsearch.retrieval",),
        (*FEATURES, *TRANSPORT, *ENTRY_POINTS, "dwsearch.rest", "dwsearch.console"),
        "dwsearch.retrieval is the engine chat search and the Index share: it knows neither of them",
    ),
    Rule(
        "index-does-not-import-search",
        ("dwsearch.index",),
        ("dwsearch.search",),
        "the features are siblings: what index and search share lives below both (common, clients, db)",
    ),
    Rule(
        "search-imports-no-other-feature",
        ("dwsearch.search",),
        ("dwsearch.sweep", "dwsearch.index"),
        "the features are siblings: what they share lives below them",
    ),
    Rule(
        "sweep-imports-no-other-feature",
        ("dwsearch.sweep",),
        ("dwsearch.search", "dwsearch.index"),
        "the features are siblings: what they share lives below them",
    ),
    Rule(
        "reranker-does-not-import-embedder",
        ("dwsearch_reranker",),
        ("dwsearch_embedder",),
        "the model services share their runtime through dwsearch.modelserver, not through each other",
    ),
    Rule(
        "embedder-does-not-import-reranker",
        ("dwsearch_embedder",),
        ("dwsearch_reranker",),
        "the model services share their runtime through dwsearch.modelserver, not through each other",
    ),
    Rule(
        "model-services-stay-out-of-the-server",
        ("dwsearch_embedder", "dwsearch_reranker"),
        (*SERVER_ONLY, *ENTRY_POINTS),
        "the embedder and reranker images run without the server's features",
    ),
    Rule(
        "adapters-import-no-domain-objects",
        ADAPTERS,
        ORCHESTRATORS,
        "adapters (SQL, clients) are called by the domain, never the other way round",
    ),
    Rule(
        "stores-import-no-transport",
        STORES,
        (*TRANSPORT, *ENTRY_POINTS),
        "store modules are adapters: they know SQL, not gRPC",
    ),
    Rule(
        "the-console-reads-through-the-domain",
        ("dwsearch.console",),
        (*STORES, "dwsearch.db", "dwsearch.flags"),
        "the console is a transport: every read it makes of the database is a function of the domain "
        "(dwsearch.sweep.overview, dwsearch.index.reads), never SQL of its own nor a SQL adapter's (store "
        "modules, dwsearch.flags, dwsearch.db); of dwsearch.db it names only readpool's ReadPool, the type "
        "of the read pool serve hands it to pass on (test_the_console_runs_no_sql)",
        allowed=("dwsearch.db.readpool",),
    ),
    Rule(
        "only-transport-imports-transport",
        ("dwsearch",),
        (*TRANSPORT, *ENTRY_POINTS),
        "transport may import the domain, never the other way round",
        # Transport and the entry points may import transport: serve hosts the servicers,
        # the CLI dispatches to the commands.
        exempt=(*TRANSPORT, *ENTRY_POINTS),
    ),
)


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_import_rule(rule: Rule) -> None:
    found = rule.violations()
    assert not found, f"{rule.why}:\n" + "\n".join(
        f"  {i.source} (line {i.line}) imports {i.target}" for i in found
    )


def test_the_scan_sees_the_package() -> None:
    """Not vacuous: the scan finds the layers and the imports the rules are about."""
    for module in ("dwsearch.search.service", "dwsearch.sweep.service", "dwsearch.index.service"):
        assert module in MODULES
        assert matches(module, TRANSPORT)
    assert any(matches(m, STORES) for m in MODULES)
    for orchestrator in ORCHESTRATORS:
        assert orchestrator in MODULES, f"{orchestrator} moved: update ORCHESTRATORS and docs/architecture.md"
    assert "dwsearch_embedder.engine" in MODULES and "dwsearch_reranker.engine" in MODULES
    targets = {(i.source, i.target) for i in IMPORTS}
    assert ("dwsearch.search.service", "dwsearch.search.searcher") in targets
    assert any(source == "dwsearch.serve" and matches(t, TRANSPORT) for source, t in targets)
    for rule in RULES:
        assert any(rule.covers(m) for m in MODULES), f"{rule.name}: no module matches its sources"


def test_the_scan_resolves_imports() -> None:
    """Absolute, relative and from-imports name the module they reach; a rule violation
    in any of those forms is found."""
    modules = {"dwsearch.index", "dwsearch.index.fusion", "dwsearch.search", "dwsearch.search.fusion"}
    text = (
        "import dwsearch.search.fusion\n"
        "from dwsearch.search import fusion\n"
        "from dwsearch.search.fusion import RRF_K\n"
        "from ..search import fusion\n"
        "from . import fusion\n"
        "def later():\n    from dwsearch.search import searcher\n"
    )
    found = [i.target for i in file_imports("dwsearch.index.store", text, is_package=False, modules=modules)]
    assert found == [
        "dwsearch.search.fusion",
        "dwsearch.search.fusion",
        "dwsearch.search.fusion",
        "dwsearch.search.fusion",
        "dwsearch.index.fusion",
        "dwsearch.search",
    ]
    assert (
        module_name(
            "dwsearch", PACKAGE_ROOTS["dwsearch"], PACKAGE_ROOTS["dwsearch"] / "sweep" / "__init__.py"
        )
        == "dwsearch.sweep"
    )
    assert within("dwsearch.sweep.store_status", "dwsearch.sweep.store*")
    assert within("dwsearch.sweep.store.writes", "dwsearch.sweep.store*")
    assert within("dwsearch.search.service", "dwsearch.*.service")
    assert not within("dwsearch.searchx", "dwsearch.search")


# --- the console runs no SQL -----------------------------------------------------------------

CONSOLE = PACKAGE_ROOTS["dwsearch"] / "console"
# A connection checked out, a statement or a cursor: what a module that runs SQL calls.
SQL_CALLS = ("connection", "execute", "executemany", "cursor")


def sql_uses(text: str) -> list[str]:
    """What in a module's source (`text`) runs SQL or names more of dwsearch.db than the
    ReadPool type, one line each in source order: a psycopg import (its sql, connections,
    cursors; psycopg_pool, whose pool type the console holds, is another package), a call
    of a SQL_CALLS method, any other name imported from dwsearch.db.readpool."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.extend(
                (node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] == "psycopg"
            )
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] == "psycopg":
                found.append((node.lineno, f"from {node.module} import ..."))
            elif node.module == "dwsearch.db.readpool":
                found.extend((node.lineno, f"imports {a.name}") for a in node.names if a.name != "ReadPool")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SQL_CALLS
        ):
            found.append((node.lineno, f".{node.func.attr}()"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_the_console_runs_no_sql() -> None:
    """The console's reads are the domain's functions (docs/architecture.md, "Import
    rule"): no module of dwsearch.console imports psycopg, checks out a connection or runs a
    statement, and the one name it takes of dwsearch.db is ReadPool, the read pool's type."""
    paths = sorted(CONSOLE.rglob("*.py"))
    assert len(paths) >= 5  # not vacuous: app, orgs, projection, history, server, …
    found = [
        f"  {path.relative_to(ROOT)} {use}" for path in paths for use in sql_uses(path.read_text("utf-8"))
    ]
    assert not found, "the console runs SQL of its own; read through the domain instead:\n" + "\n".join(found)


def test_the_sql_check_finds_sql() -> None:
    """Not vacuous: each way of running SQL is found, a pool type and the domain's call are not."""
    text = (
        "import psycopg\n"
        "from psycopg import sql\n"
        "from psycopg_pool import AsyncConnectionPool\n"
        "from dwsearch.db.readpool import ReadPool, read_retrying\n"
        "async def read(pool):\n"
        "    async with pool.connection() as conn:\n"
        "        await conn.execute('SELECT 1')\n"
        "        await overview.org_figures(pool, 'm', limit=1)\n"
    )
    assert [use.split(":")[0] for use in sql_uses(text)] == [f"line {n}" for n in (1, 2, 4, 6, 7)]


# --- no import cycles among the product's modules ------------------------------------------


def import_cycles(modules: set[str], imports: Iterable[Import]) -> list[list[str]]:
    """The import graph's cycles: its strongly connected components of more than one
    module (Tarjan's algorithm), each sorted, in the order of their first module.

    An edge is one module's import of another, as the scan resolves it: `from dwsearch.x
    import y` with y a submodule is an edge to dwsearch.x.y, not to the package, so a
    package whose `__init__` re-exports nothing is in no cycle; one whose `__init__`
    imports its modules is, when one of them imports a name from the package."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports:
        if i.source in graph and i.target in graph and i.target != i.source:
            graph[i.source].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_no_import_cycles() -> None:
    """No module imports, through others, a module that imports it: the layers of the
    import rule are a tree one reads top-down, and a cycle (even a type-only one, under
    `if TYPE_CHECKING:`) ties two modules into one that neither can be read or moved
    without. What one needs of the other belongs in a module below both."""
    found = []
    for cycle in import_cycles(MODULES, IMPORTS):
        members = set(cycle)
        lines = sorted(
            {(i.source, i.line, i.target) for i in IMPORTS if i.source in members and i.target in members}
        )
        found.append(
            f"  {', '.join(cycle)}:\n"
            + "\n".join(f"    {source} (line {line}) imports {target}" for source, line, target in lines)
        )
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_cycle_check_finds_cycles() -> None:
    """Not vacuous: a cycle of three and one of two are found, a chain is not; a package
    whose module imports a sibling through the package's name is no cycle."""
    edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d"), ("e", "f"), ("a", "a")]
    imports = [Import(s, t, 1) for s, t in edges]
    assert import_cycles({"a", "b", "c", "d", "e", "f", "g"}, imports) == [["a", "b", "c"], ["d", "e"]]
    modules = {"dwsearch.x", "dwsearch.x.y", "dwsearch.x.z"}
    package = file_imports("dwsearch.x", "from dwsearch.x import y\n", is_package=True, modules=modules)
    module = file_imports("dwsearch.x.y", "from dwsearch.x import z\n", is_package=False, modules=modules)
    assert import_cycles(modules, [*package, *module]) == []
    module = file_imports("dwsearch.x.y", "from dwsearch.x import NAME\n", is_package=False, modules=modules)
    assert import_cycles(modules, [*package, *module]) == [["dwsearch.x", "dwsearch.x.y"]]


# --- the domain errors carry no transport ---------------------------------------------------

# Modules that must load without gRPC, through no module of the packages either: the
# domain errors (each with its kind, mapped by each transport's own table) and the HTTP
# ports' table of statuses.
GRPC_FREE = ("dwsearch.common.errors", "dwsearch.common.httpstatus")
# gRPC itself, its health and reflection packages, and the generated service stubs.
GRPC = ("grpc*", f"{GENERATED}.*_grpc")


def every_import() -> list[Import]:
    """The packages' imports of any module, the standard library's and grpc's too (IMPORTS
    keeps only those of the packages' own)."""
    files = dict(source_files())
    return [
        i
        for name, path in files.items()
        for i in file_imports(
            name, path.read_text(encoding="utf-8"), is_package=path.name == "__init__.py", modules=set(files)
        )
    ]


def import_chains(start: str, imports: Iterable[Import]) -> dict[str, list[Import]]:
    """Every module that importing `start` loads, directly or through the packages' own
    modules, with a shortest chain of imports that loads it (a module loads its packages'
    `__init__` first: reached by the chain that reaches the module)."""
    edges: dict[str, list[Import]] = {}
    for i in imports:
        edges.setdefault(i.source, []).append(i)
    chains: dict[str, list[Import]] = {}
    queue: list[str] = []

    def reach(module: str, chain: list[Import]) -> None:
        parts = module.split(".")
        for k in range(len(parts), 0, -1):  # the module, then its packages
            name = ".".join(parts[:k])
            if name not in chains:
                chains[name] = chain
                queue.append(name)

    reach(start, [])
    while queue:
        module = queue.pop(0)
        for i in sorted(edges.get(module, ()), key=lambda i: (i.line, i.target)):
            reach(i.target, [*chains[module], i])
    return {module: chain for module, chain in chains.items() if chain}


def test_the_domain_errors_import_no_grpc() -> None:
    """dwsearch.common.errors gives each error a kind, not a gRPC status: each transport
    maps kinds with its own table (dwsearch.common.grpcstatus for gRPC,
    dwsearch.common.httpstatus for every HTTP port). Loading the errors, or the HTTP table,
    loads no gRPC, not even through another module of the packages."""
    imports = every_import()
    found = []
    for module in GRPC_FREE:
        for target, chain in sorted(import_chains(module, imports).items()):
            if matches(target, GRPC) and chain[-1].target == target:
                found.append(
                    f"  {module} loads {target}:\n"
                    + "\n".join(f"    {i.source} (line {i.line}) imports {i.target}" for i in chain)
                )
    assert not found, (
        "the domain errors carry no transport's type (a kind, which each transport maps with "
        "its own table: dwsearch.common.grpcstatus, dwsearch.common.httpstatus):\n" + "\n".join(found)
    )


def test_the_grpc_check_finds_grpc() -> None:
    """Not vacuous: an import of grpc found directly and through a chain of the packages'
    modules (and their packages), with the chain; the gRPC table does load grpc."""
    sources = {
        "dwsearch.x": "import grpc_health.v1\n",
        "dwsearch.x.a": "import enum\nfrom dwsearch.x import b\n",
        "dwsearch.x.b": "from grpc import aio\n",
        "dwsearch.x.c": "import grpc\n",
    }
    imports = [
        i
        for name, text in sources.items()
        for i in file_imports(name, text, is_package=name == "dwsearch.x", modules=set(sources))
    ]
    chains = import_chains("dwsearch.x.a", imports)
    assert [(i.source, i.line, i.target) for i in chains["grpc"]] == [
        ("dwsearch.x.a", 2, "dwsearch.x.b"),
        ("dwsearch.x.b", 1, "grpc"),
    ]
    assert chains["grpc_health.v1"][-1].source == "dwsearch.x"  # the package's __init__
    assert "dwsearch.x.c" not in chains and all(matches(t, GRPC) for t in ("grpc", "grpc_health.v1"))
    assert matches(f"{GENERATED}.index_pb2_grpc", GRPC) and not matches(f"{GENERATED}.index_pb2", GRPC)
    table = import_chains("dwsearch.common.grpcstatus", every_import())
    assert "grpc" in table and "dwsearch.common.errors" in table


# --- private names stay private; one engine's SQL is written once --------------------------


def private_imports(name: str, text: str) -> list[str]:
    """`from M import _x` (and `M._x` through `import M`) in module `name`, M one of the
    packages: a name another module keeps private, used as if it were its API."""
    found = []
    tree = ast.parse(text)
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGE_ROOTS:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{name} (line {node.lineno}): from {node.module} import {alias.name}")
                elif f"{node.module}.{alias.name}" in MODULES:
                    imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            imported.update(a.asname or a.name for a in node.names if a.name.split(".")[0] in PACKAGE_ROOTS)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{name} (line {node.lineno}): {node.value.id}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    """A `_name` is its module's own: a module that needs it from another needs an API
    (the name made public where it lives, or the code moved to where it is used). The
    files that shared private names were one module split in two."""
    found = [
        hit
        for name, path in source_files()
        for hit in private_imports(name, path.read_text(encoding="utf-8"))
    ]
    assert found == [], "private names imported from another module:\n  " + "\n  ".join(found)


def test_the_private_import_check_finds_them() -> None:
    """Not vacuous: both spellings are found, a module's own private names and dunders are not."""
    modules_text = (
        "from dwsearch.search.legs import _FullText, ChatLegs\n"
        "from dwsearch.search.store import scope\n"
        "x = scope._window\n"
        "y = scope.__name__\n"
        "def _own(): pass\n"
    )
    assert private_imports("dwsearch.x", modules_text) == [
        "dwsearch.x (line 1): from dwsearch.search.legs import _FullText",
        "dwsearch.x (line 3): scope._window",
    ]


NEAREST_SQL = "dwsearch.retrieval.store.nearest"
HNSW_DDL = "dwsearch.retrieval.store.hnsw"


def modules_containing(pattern: str) -> set[str]:
    import re

    regex = re.compile(pattern, re.IGNORECASE)
    return {name for name, path in source_files() if regex.search(path.read_text(encoding="utf-8"))}


def test_nearest_neighbour_sql_is_built_in_one_module() -> None:
    """pgvector's distance operators (<#>, <=>, <->) appear in one module: chat search and
    the Index build every nearest-neighbour statement through it, so a fix to one reaches
    both (dwsearch.retrieval.store.nearest)."""
    assert modules_containing(r"<#>|<=>|<->") == {NEAREST_SQL}


def test_one_candidate_policy() -> None:
    """How many candidates a leg retrieves is decided in one place
    (dwsearch.retrieval.candidates.per_leg): no other module keeps a number of candidates or
    an overfetch factor of its own. Agent context's seed-fixed floor is handed to per_leg."""
    import re

    sizes = re.compile(r"^[A-Z_]*(CANDIDATES|OVERFETCH)[A-Z_]*\s*(:[^=]+)?=\s*\d", re.MULTILINE)
    found = {name for name, path in source_files() if sizes.search(path.read_text(encoding="utf-8"))}
    assert found == {"dwsearch.retrieval.candidates", "dwsearch.index.context"}
    assert modules_containing(r"\bper_leg\(") >= {
        "dwsearch.search.searcher",
        "dwsearch.search.similar",
        "dwsearch.index.reads",
        "dwsearch.index.context",
    }


def test_hnsw_ddl_is_written_in_one_module() -> None:
    """Every HNSW index dwsearch builds (the opt-in per model, an org's own) is created by
    one statement (dwsearch.retrieval.store.hnsw)."""
    assert modules_containing(r"USING\s+hnsw") == {HNSW_DDL}


# --- docs/design.md's constants table names the code's values -----------------------------

DESIGN = ROOT / "docs" / "design.md"


def constants_table() -> list[tuple[list[str], str, str]]:
    """(names, value, module) per row of design.md's "Constants" table."""
    section = DESIGN.read_text(encoding="utf-8").split("\n## Constants\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        names = [n.strip("` ") for n in cells[0].split(",")]
        module = cells[2].split("`")[1]
        rows.append((names, cells[1], module))
    return rows


def documented_value(text: str) -> object | None:
    """A table value as Python would hold it, when it is one plain quantity."""
    import re
    from datetime import timedelta

    number = r"(\d[\d,]*(?:\.\d+)?)"
    if m := re.fullmatch(r"`([^`]*)`", text):
        return m[1]
    if m := re.fullmatch(number + r" minutes", text):
        return timedelta(minutes=float(m[1].replace(",", "")))
    if m := re.fullmatch(number + r"(?: s| ms| σ)?", text):
        value = float(m[1].replace(",", ""))
        return int(value) if value.is_integer() and "." not in m[1] else value
    return None


def test_design_constants_are_the_codes() -> None:
    """Every name in design.md's "Constants" table is defined in the module it names, and
    each single plain value there is the code's value: the doc cannot drift silently."""
    import dataclasses
    import importlib

    rows = constants_table()
    assert len(rows) >= 20
    checked = 0
    for names, value, module_path in rows:
        module = importlib.import_module(module_path)
        values = [v.strip() for v in value.split(",")] if len(names) > 1 else [value]
        for i, name in enumerate(names):
            if name.islower():  # a setting: a field of one of the module's config dataclasses
                # The first config class that has it: ServerConfig, serve's settings.
                fields = [
                    f.default
                    for obj in vars(module).values()
                    if isinstance(obj, type) and dataclasses.is_dataclass(obj)
                    for f in dataclasses.fields(obj)
                    if f.name == name
                ]
                assert fields, f"design.md: {module_path} has no setting {name}"
                actual: object = fields[0]
            else:
                assert hasattr(module, name), f"design.md: {module_path} does not define {name}"
                actual = getattr(module, name)
            expected = documented_value(values[i]) if len(values) == len(names) else None
            if isinstance(actual, Decimal):
                actual = float(actual)
            if expected is not None and not isinstance(actual, (dict, tuple)):
                assert actual == expected, f"design.md says {name} = {value}; {module_path} has {actual!r}"
                checked += 1
    assert checked >= 15


# --- docs/architecture.md names what the code has ------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _class_members() -> dict[str, set[str]]:
    """Every class of the packages with the names its body defines (methods, fields)."""
    members: dict[str, set[str]] = {}
    for root in PACKAGE_ROOTS.values():
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    names = members.setdefault(node.name, set())
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            names.add(item.name)
                        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                            names.add(item.target.id)
                        elif isinstance(item, ast.Assign):
                            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return members


def test_the_architecture_doc_names_only_what_the_code_has() -> None:
    """Every module (`dwsearch….`) and every `Class.member` the module map and the walks
    name exists: a rename or a move that forgets the doc fails here."""
    import importlib
    import re

    text = ARCHITECTURE.read_text(encoding="utf-8")
    missing = []
    for dotted in sorted(set(re.findall(r"`(dwsearch[a-z_]*(?:\.[A-Za-z_]\w*)*)", text))):
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj: object = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(dotted)
            break
        else:
            missing.append(dotted)
    members = _class_members()
    named = sorted(set(re.findall(r"`([A-Z][A-Za-z0-9]+)\.([a-z_]\w*)", text)))
    assert len(named) >= 30  # not vacuous: the walks name that many methods
    for cls, member in named:
        if cls in members and member not in members[cls]:
            missing.append(f"{cls}.{member}")
        elif cls not in members:
            missing.append(f"{cls} (no such class)")
    assert missing == []
