"""DWSEARCH_THREADS: the container's CPU quota by default, read from cgroup files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dwsearch.modelserver import threads
from dwsearch.modelserver.threads import THREAD_ENV_VARS, apply_thread_env, cgroup_cpu_quota, resolve_threads


def cgroup(tmp_path: Path, v2: str | None = None, v1: tuple[str, str] | None = None) -> Path:
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(v1[0])
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(v1[1])
    return tmp_path


@pytest.mark.parametrize(
    "v2,v1,quota",
    [
        ("max 100000", None, None),
        ("200000 100000", None, 2.0),
        ("150000 100000", None, 1.5),
        (None, ("400000", "100000"), 4.0),
        (None, ("-1", "100000"), None),
        (None, None, None),
    ],
)
def test_the_cpu_quota_comes_from_cgroup_v2_or_v1(tmp_path, v2, v1, quota):
    assert cgroup_cpu_quota(cgroup(tmp_path, v2, v1)) == quota


def test_threads_default_to_the_quota_rounded_up_and_capped_by_the_cpus(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "available_cpus", lambda: 8)
    assert resolve_threads(0, cgroup(tmp_path / "a", "150000 100000")) == 2
    assert resolve_threads(0, cgroup(tmp_path / "b", "50000 100000")) == 1
    assert resolve_threads(0, cgroup(tmp_path / "c", "1600000 100000")) == 8
    assert resolve_threads(0, cgroup(tmp_path / "d", "max 100000")) == 8
    assert resolve_threads(3, cgroup(tmp_path / "e", "100000 100000")) == 3  # an explicit setting wins
    with pytest.raises(ValueError, match="threads must be 0"):
        resolve_threads(-1)


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    for name in "abcde":
        (tmp_path / name).mkdir()
    return tmp_path


def test_the_openmp_and_blas_pools_are_sized_through_their_variables(monkeypatch):
    for name in THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    apply_thread_env(3)
    assert all(os.environ[name] == "3" for name in THREAD_ENV_VARS)
