"""A real pgbouncer in transaction mode in front of a Postgres, on loopback (the pgbouncer
tests, and the soak's topology).

Raises PgbouncerUnavailable (saying why) where the `pgbouncer` binary is missing:
`apt-get install pgbouncer` (Debian); CI installs it (.ci/run). The tests skip on it
(tests/support/pgbouncer.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dwsearch_testkit.net import free_port


class PgbouncerUnavailable(RuntimeError):
    """No pgbouncer binary, or no user to run it as."""


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer") if os.access(p, os.X_OK)), None
    )


@contextmanager
def pgbouncer(
    server_url: str, *, pool_mode: str = "transaction", pool_size: int = 3, extra_users: tuple[str, ...] = ()
) -> Iterator[str]:
    """Run pgbouncer in front of server_url's server (trust auth for its user and
    extra_users); yield server_url with pgbouncer's host and port (any database)."""
    binary = pgbouncer_binary()
    if binary is None:
        raise PgbouncerUnavailable("pgbouncer is not installed (apt-get install pgbouncer); CI installs it")
    params = conninfo_to_dict(server_url)
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    work = Path(tempfile.mkdtemp(prefix="dwsearch-pgbouncer-"))
    work.chmod(0o755)
    listen = free_port()
    users = {params.get("user") or "postgres", *extra_users}
    (work / "users.txt").write_text("".join(f'"{u}" ""\n' for u in sorted(users)))
    (work / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {work / "users.txt"}
pool_mode = {pool_mode}
default_pool_size = {pool_size}
max_client_conn = 200
server_reset_query =
ignore_startup_parameters = extra_float_digits
"""
    )
    cmd = [binary, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        user = next((u for u in ("pgserver", "nobody") if _user_exists(u)), None)
        if user is None:
            raise PgbouncerUnavailable("running as root, and no unprivileged user for pgbouncer")
        cmd[1:1] = ["-u", user]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url_params = {**params, "host": "127.0.0.1", "port": str(listen)}
    url_params.pop("options", None)  # pgbouncer 1.18 refuses the options startup parameter
    url = make_conninfo(**url_params)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"pgbouncer did not start: {proc.communicate()[0]}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
