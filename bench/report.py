"""Shared benchmark plumbing: arguments, percentiles, the printed table, the JSON file."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    return p


def percentile(samples: Sequence[float], q: float) -> float:
    """q in [0, 100]; nearest-rank on the sorted samples."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> dict[str, Any]:
    """Where a figure was measured: the CPU class decides which int8 kernels run
    (dwsearch.modelserver.cpuclass), so every result records it."""
    from dwsearch.modelserver import cpuclass

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": model,
        "cpu_class": cpuclass.detect(),
        "cpus": os.cpu_count(),
    }


def write(name: str, figures: dict[str, Any], *, params: dict[str, Any] | None = None) -> Path:
    """Print the figures as a table and write bench/results/<name>.json."""
    width = max(len(k) for k in figures)
    print(f"\n{name}")
    print("-" * (width + 16))
    for key, value in figures.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {
        "benchmark": name,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "params": params or {},
        "figures": figures,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"-> {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return path
