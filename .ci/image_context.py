#!/usr/bin/env python3
"""Rebuild a Dockerfile's build context the way `docker build` sees it, without docker.

    image_context.py DOCKERFILE DEST

Reads .dockerignore (Docker's rules: patterns in order, the last one that matches a path
or one of its parent directories wins, `!` re-includes, `*` and `?` stay within one path
segment, `**` spans any number) and the Dockerfile's COPY lines that read the build
context (no --from), and copies exactly those files to DEST/<destination> with
destinations resolved against the stage's WORKDIR (DEST/src/... for WORKDIR /src). A
COPY source that .dockerignore leaves out fails here as it fails in `docker build`.
Prints the workdir of the last COPY (the directory `pip install` gets) on stdout.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
import sys
from pathlib import Path


def ignore_rules(root: Path) -> list[tuple[bool, re.Pattern[str]]]:
    path = root / ".dockerignore"
    rules = []
    if not path.exists():
        return rules
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = posixpath.normpath(line[1:].strip() if negate else line).lstrip("/")
        rules.append((negate, re.compile(glob_regex(pattern))))
    return rules


def glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        out.append({"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c)))
        i += 1
    return "^" + "".join(out) + "$"


def excluded(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = rel.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for negate, regex in rules:
        if any(regex.match(c) for c in candidates):
            result = not negate
    return result


def context_files(root: Path, rules, negations: list[str]) -> set[str]:
    """Every file of the build context, relative to root. An excluded directory is not
    descended into unless a `!` pattern may re-include something below it."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath).relative_to(root).as_posix()
        base = "" if base == "." else base + "/"
        dirnames[:] = [
            d
            for d in dirnames
            if not excluded(base + d, rules)
            or any(n.startswith(base + d + "/") or "*" in n for n in negations)
        ]
        found.update(base + f for f in filenames if not excluded(base + f, rules))
    return found


def copy_lines(dockerfile: Path) -> list[tuple[str, list[str], str]]:
    """(workdir, sources, destination) of every COPY that reads the build context."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    workdir, out = "/", []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            workdir = "/"
        elif word == "WORKDIR":
            workdir = posixpath.join(workdir, rest.strip())
        elif word in ("COPY", "ADD"):
            args = shlex.split(rest)
            flags = [a for a in args if a.startswith("--")]
            args = [a for a in args if not a.startswith("--")]
            if any(f.startswith("--from") for f in flags):
                continue
            out.append((workdir, args[:-1], args[-1]))
    return out


def main() -> int:
    dockerfile, dest = Path(sys.argv[1]), Path(sys.argv[2])
    root = dockerfile.resolve().parent
    rules = ignore_rules(root)
    negations = (
        [
            line.strip()[1:].strip()
            for line in (root / ".dockerignore").read_text().splitlines()
            if line.strip().startswith("!")
        ]
        if (root / ".dockerignore").exists()
        else []
    )
    files = context_files(root, rules, negations)
    last_workdir = "/"
    errors = []
    for workdir, sources, target in copy_lines(dockerfile):
        target_abs = posixpath.normpath(posixpath.join(workdir, target))
        many = len(sources) > 1 or target.endswith("/")
        for src in sources:
            src = posixpath.normpath(src).lstrip("/")
            if src in files:
                name = posixpath.join(target_abs, posixpath.basename(src)) if many else target_abs
                out = dest / name.lstrip("/")
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / src, out)
                continue
            below = sorted(f for f in files if f.startswith(src + "/") or src == ".")
            if not below:
                errors.append(
                    f"{dockerfile.name}: COPY {src}: not in the build context (.dockerignore or missing)"
                )
                continue
            for f in below:
                rel = f if src == "." else f[len(src) + 1 :]
                out = dest / posixpath.join(target_abs, rel).lstrip("/")
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / f, out)
        last_workdir = workdir
    for e in errors:
        print(e, file=sys.stderr)
    print(dest / last_workdir.lstrip("/"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
