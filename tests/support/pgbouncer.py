"""The test kit's pgbouncer (dwsearch_testkit.pgbouncer) for the tests: skipped, saying
why, where pgbouncer is unavailable."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from dwsearch_testkit import pgbouncer as kit


@contextmanager
def pgbouncer(server_url: str, **options: Any) -> Iterator[str]:
    """dwsearch_testkit.pgbouncer.pgbouncer, or a skip where it cannot run."""
    with ExitStack() as stack:
        try:
            url = stack.enter_context(kit.pgbouncer(server_url, **options))
        except kit.PgbouncerUnavailable as exc:
            pytest.skip(str(exc))
        yield url
