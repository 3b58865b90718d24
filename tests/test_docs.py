"""The docs name only what exists: every repository path README.md and docs/**/*.md give in
backticks, in a code block or as a link (and a link's #heading); every test as a
function of its file (`tests/….py::test_name`, `test_….py::test_name` of a file the tests
hold once, or `::test_name` of the test file named last); every `python -m bench.<name>`,
`make <target>` and `dwsearch <command>`. A move or a rename that forgets a doc fails here.

A path with a placeholder or a wildcard (`bench/results/*.json`, `k8s/overlays/<env>`)
names no one file and is not checked."""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The folders a repository path starts with.
PATH_ROOTS = ("tests", "server", "embedder", "reranker", "bench", "k8s", "protos", ".ci", "docs", "go")
# Paths of other projects the docs compare with, not of this repository.
OTHER_PROJECTS = {
    "server/text_generation_server/",  # TGI's layout (docs/architecture.md, "Layout")
}
PLACEHOLDER = re.compile(r"[<>*{}…$\[\]]|\.\.\.")

_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(r) for r in PATH_ROOTS) + r")/\S*)")
# A test: its file (with or without tests/…/) and a name, or `::name` alone.
_TEST = re.compile(
    r"(?<![\w./-])(?P<file>(?:tests/(?:[\w.-]+/)*)?test_\w+\.py)(?:::(?P<name>\w+(?:::\w+)?))?"
    r"|(?<![\w.:])::(?P<more>\w+)"
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.S | re.M)
_SPAN = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Ref:
    doc: str
    kind: str  # path, test, anchor, bench, make, dwsearch
    name: str

    def __str__(self) -> str:
        return f"{self.doc}: {self.kind} {self.name}"


def code_texts(text: str) -> Iterator[str]:
    """The doc's code in its order: each line of a fenced block, each inline code span."""
    at = 0
    for block in [*_FENCE.finditer(text), None]:
        prose = text[at : block.start() if block else len(text)]
        for span in _SPAN.finditer(prose):
            yield " ".join(span.group(1).split())
        if block:
            yield from block.group(2).splitlines()
            at = block.end()


def commands(code: str) -> Iterator[list[str]]:
    """The words of each shell command in `code` (a line or a span): comments cut, split at
    `&&` and `;`, leading `$ ` and VAR=value assignments dropped."""
    code = code.split(" #", 1)[0]
    for part in re.split(r"&&|;", code):
        words = part.split()
        while words and (words[0] == "$" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0])):
            words.pop(0)
        if words:
            yield words


@cache
def modules_by_file_name() -> dict[str, list[str]]:
    """The test modules under tests/ by file name (the npm packages' folders left out)."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if "node_modules" not in path.parts:
            found.setdefault(path.name, []).append(path.relative_to(ROOT).as_posix())
    return found


def resolve_test_file(file: str) -> str:
    """`file` as its path: a bare test_….py is the one file of that name under tests/."""
    if file.startswith("tests/"):
        return file
    found = modules_by_file_name().get(file, [])
    return found[0] if len(found) == 1 else file


def references(doc: Path, text: str | None = None) -> Iterator[Ref]:
    """What `doc` (its `text`, read when None) names; its links are relative to its folder."""
    name = doc.relative_to(ROOT).as_posix()
    text = doc.read_text(encoding="utf-8") if text is None else text
    last_test_file = ""
    for code in code_texts(text):
        for match in _PATH.finditer(code):
            path = match.group(1).rstrip(".,;:)'\"")
            if "::" in path or path in OTHER_PROJECTS or PLACEHOLDER.search(path):
                continue  # a test with its name is _TEST's
            yield Ref(name, "path", path)
        for match in _TEST.finditer(code):
            if match["more"]:
                yield Ref(name, "test", f"{last_test_file or '(no file)'}::{match['more']}")
                continue
            last_test_file = resolve_test_file(match["file"])
            if match["name"]:
                yield Ref(name, "test", f"{last_test_file}::{match['name']}")
            elif not match["file"].startswith("tests/"):
                yield Ref(name, "path", last_test_file)
        for words in commands(code):
            program = words[0].rsplit("/", 1)[-1]
            if program == "make":
                targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
                yield from (Ref(name, "make", t) for t in targets if not PLACEHOLDER.search(t))
            elif program == "dwsearch" and len(words) > 1:
                # `dwsearch serve | embedder | …`: the synopsis names each command.
                rest = " ".join(words[1:])
                names = rest.split(" | ") if re.fullmatch(r"[a-z-]+( \| [a-z-]+)+", rest) else [words[1]]
                yield from (Ref(name, "dwsearch", n) for n in names if not PLACEHOLDER.search(n))
            elif program.startswith("python") and len(words) > 2 and words[1] == "-m":
                module = words[2]
                if module.startswith("bench.") and not PLACEHOLDER.search(module):
                    yield Ref(name, "bench", module)
    for match in _LINK.finditer(text):
        target, _, anchor = match.group(1).partition("#")
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path = (doc.parent / target).resolve().relative_to(ROOT).as_posix() if target else name
        if target:
            yield Ref(name, "path", path + ("/" if target.endswith("/") else ""))
        if anchor:
            yield Ref(name, "anchor", f"{path}#{anchor}")


@cache
def defined_names(path: Path) -> frozenset[str]:
    """The functions and classes a module defines, and each class's as Class::method."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return frozenset(names)


@cache
def anchors(path: Path) -> frozenset[str]:
    """The link anchors of a Markdown file's headings, as GitHub makes them."""
    prose = _FENCE.sub("", path.read_text(encoding="utf-8"))
    headings = re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", prose, re.M)
    return frozenset(re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings)


@cache
def make_targets() -> frozenset[str]:
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        if m := re.match(r"([A-Za-z0-9][\w.-]*(?:[ \t]+[A-Za-z0-9][\w.-]*)*)[ \t]*::?(?!=)", line):
            targets.update(m.group(1).split())
    return frozenset(targets)


@cache
def cli_commands() -> frozenset[str]:
    """The subcommands `dwsearch` has: its parser's, as dwsearch.cli builds it (argparse
    keeps them in its subparsers action's choices)."""
    from dwsearch.cli import build_parser

    return frozenset(
        command
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for command in action.choices
    )


def exists(ref: Ref) -> bool:
    if ref.kind == "path":
        path = ROOT / ref.name
        return path.is_dir() if ref.name.endswith("/") else path.exists()
    if ref.kind == "test":
        file, _, test = ref.name.partition("::")
        path = ROOT / file
        return path.is_file() and test.split("[", 1)[0] in defined_names(path)
    if ref.kind == "bench":
        parts = ref.name.split(".")
        return (ROOT.joinpath(*parts).with_suffix(".py")).is_file() or (
            ROOT.joinpath(*parts) / "__main__.py"
        ).is_file()
    if ref.kind == "anchor":
        file, _, anchor = ref.name.partition("#")
        return (ROOT / file).is_file() and anchor in anchors(ROOT / file)
    if ref.kind == "make":
        return ref.name in make_targets()
    return ref.name in cli_commands()


REFS = sorted({r for doc in DOCS for r in references(doc)}, key=str)


def test_the_docs_name_only_what_exists() -> None:
    missing = [str(r) for r in REFS if not exists(r)]
    assert not missing, "the docs name what does not exist:\n  " + "\n  ".join(missing)


def test_the_docs_scan_finds_references() -> None:
    """Not vacuous: the scan finds the docs' paths, tests, benchmarks, make targets and
    commands in their number, and its parsers know the Makefile's and the CLI's names."""
    kinds = {
        k: {r.name for r in REFS if r.kind == k}
        for k in ("path", "test", "anchor", "bench", "make", "dwsearch")
    }
    assert len(kinds["path"]) >= 80
    assert len(kinds["test"]) >= 60
    assert len(kinds["anchor"]) >= 15
    assert len(kinds["bench"]) >= 6
    assert len(kinds["make"]) >= 8
    assert len(kinds["dwsearch"]) >= 12
    assert {"test", "demo", "check", "protos", "bench", "protos-check", "lint"} <= make_targets()
    assert {"serve", "embedder", "reranker", "sweep", "migrate", "dev", "demo"} <= cli_commands()
    assert {r.doc for r in REFS} == {doc.relative_to(ROOT).as_posix() for doc in DOCS}
    assert "docs/reliability.md" in {r.doc for r in REFS if r.kind == "test"}


def test_the_scan_reads_paths_tests_commands_and_placeholders() -> None:
    text = (
        "See `tests/test_docs.py::test_x`, `::test_y`, `test_architecture.py::test_z`,\n"
        "`test_cli.py`, `bench/results/*.json`, `k8s/overlays/<env>`, `server/text_generation_server/`\n"
        "and [the design](design.md#watermark); run `make demo DEMO_ARGS=--keep-running`,\n"
        "`.venv/bin/dwsearch sweep --org-id o`, `dwsearch serve | embedder`, `dwsearch <command>`\n"
        "and `python -m bench.data.make_chat_quality`. Not code: make it, dwsearch reads.\n"
        "  ```sh\n  DB=x .venv/bin/python -m pytest tests/reliability   # two minutes\n  make test\n  ```\n"
    )
    found = {(r.kind, r.name) for r in references(ROOT / "docs" / "example.md", text)}
    assert found == {
        ("test", "tests/test_docs.py::test_x"),
        ("test", "tests/test_docs.py::test_y"),
        ("test", "tests/test_architecture.py::test_z"),
        ("path", "tests/test_cli.py"),
        ("path", "docs/design.md"),
        ("anchor", "docs/design.md#watermark"),
        ("make", "demo"),
        ("make", "test"),
        ("dwsearch", "sweep"),
        ("dwsearch", "serve"),
        ("dwsearch", "embedder"),
        ("bench", "bench.data.make_chat_quality"),
        ("path", "tests/reliability"),
    }
