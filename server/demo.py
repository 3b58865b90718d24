"""`dwsearch demo`: the stack on the embedded defaults, then its health."""

from __future__ import annotations

from dwsearch.common.config import StackConfig
from dwsearch.stack import LocalStack


def run_demo(config: StackConfig, *, keep_running: bool = False) -> int:
    stack = LocalStack(config)
    stack.start()
    stack.print_status()
    if keep_running:
        print(f"\nstack running; server at {stack.server_address}; Ctrl-C stops it")
        return stack.wait()
    stack.stop()
    return 0
