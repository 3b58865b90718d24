"""Waiting for what another task, thread or process makes true: poll the condition with a
deadline, never a sleep that stands in for "long enough"."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(
    condition: Callable[[], object], timeout: float = 10.0, what: str = "", interval: float = 0.01
) -> None:
    """Return as soon as `condition()` is true; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not within {timeout:g} s: {what or getattr(condition, '__name__', condition)}"
            )
        await asyncio.sleep(interval)
