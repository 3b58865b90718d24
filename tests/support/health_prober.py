"""A kubelet-style health prober in a process of its own: it opens a new connection for
each grpc.health.v1 Check, every `interval` seconds, and writes one line per probe to
stdout, flushed:

    <started> <took> <1 if SERVING else 0>

`started` is time.monotonic() (CLOCK_MONOTONIC, the same clock in every process of the
machine), `took` in seconds. It exits when stdin closes (the test that started it is gone).

    python tests/support/health_prober.py ADDRESS [--interval S] [--timeout S]

`Prober` runs it from a test. In a process of its own, the probes time the server and not
the test process: the test's garbage collections, and its (de)serializing of tens of
megabytes while holding its interpreter lock, would delay a probe thread of its own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections.abc import Callable

Probe = tuple[float, float, bool]
"""When it started (time.monotonic()), how long it took (s), whether it answered SERVING."""


class Prober:
    """The prober process, its probes recorded here as they arrive."""

    def __init__(self, address: str, interval: float = 0.05, timeout: float = 2.0) -> None:
        self.address = address
        self.interval = interval
        self.timeout = timeout
        self.probes: list[Probe] = []
        self._recorded = threading.Condition()
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Prober:
        self._proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                self.address,
                f"--interval={self.interval}",
                f"--timeout={self.timeout}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, args=(self._proc,), daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        self._reader.join(10)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            started, took, ok = line.split()
            with self._recorded:
                self.probes.append((float(started), float(took), ok == "1"))
                self._recorded.notify_all()
        with self._recorded:  # the prober exited: wake any waiter, which sees its condition fail
            self._recorded.notify_all()

    def until(self, condition: Callable[[list[Probe]], bool], timeout: float = 30.0) -> None:
        """Until `condition(probes)` holds, checked as each probe is recorded."""
        with self._recorded:
            assert self._recorded.wait_for(lambda: condition(self.probes), timeout), (
                f"the prober fell silent (exit status {self._proc and self._proc.poll()})"
            )

    def between(self, start: float, end: float) -> list[Probe]:
        """The probes that started from `start` to `end` (time.monotonic())."""
        with self._recorded:
            return [p for p in self.probes if start <= p[0] <= end]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    from dwsearch_testkit.procs import SERVING, health

    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.is_set():
        started = time.monotonic()
        ok = health(args.address, timeout=args.timeout) == SERVING
        print(f"{started:.6f} {time.monotonic() - started:.6f} {int(ok)}", flush=True)
        stop.wait(args.interval)


if __name__ == "__main__":
    main()
