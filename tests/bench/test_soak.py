"""bench.soak: the checker's window rules on histories made by hand (fast, no processes),
the nemesis' schedule, and the short variant itself: the real topology (two serves, the
fake embedder, the tiny reranker, a primary with a streaming standby, pgbouncer where
installed) under the workload and a few faults for three minutes, then every invariant
checked. It asserts what must hold, never a timing.

The short variant runs apart from the main pytest run (marker `soak`; `make test` runs
it beside the Citus suites)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bench.soak import checker, nemesis
from bench.soak.workload import History

ROOT = Path(__file__).resolve().parents[2]
T = datetime(2026, 12, 1, 9, tzinfo=UTC)
KEY = ("org", "whatsapp", "c1")


def events(*minutes: float) -> list[tuple[str, datetime]]:
    return [(f"e{i}", T + timedelta(minutes=m)) for i, m in enumerate(minutes)]


def coverage(evs, windows, now_minutes: float = 600) -> dict:
    return checker._model_coverage(
        {KEY: evs}, {KEY: list(enumerate(windows))}, T + timedelta(minutes=now_minutes)
    )


def test_a_closed_session_wholly_covered_once_holds():
    evs = events(0, 1, 2, 50, 51)  # two sessions (a 48-minute gap)
    figures = coverage(evs, [["e0", "e1", "e2"], ["e3", "e4"]])
    assert figures["sessions_closed"] == 2 and figures["lost"] == figures["doubled"] == 0


def test_lost_doubled_stale_and_broken_windows_are_each_counted():
    evs = events(0, 1, 2, 50, 51)
    assert coverage(evs, [["e0", "e1"], ["e3", "e4"]])["lost"] == 1
    assert coverage(evs, [["e0", "e1", "e2"], ["e2", "e3", "e4"]])["doubled"] == 1
    assert coverage(evs, [["e0", "e1", "e2"], ["e3", "e4", "gone"]])["stale"] == 1
    broken = coverage(evs, [["e0", "e2"], ["e1"], ["e3", "e4"]])
    assert broken["not_contiguous"] == 1
    assert coverage(evs, [["e0", "e1"], ["e2", "e3", "e4"]])["across_sessions"] == 1
    many = events(*range(16))
    assert coverage(many, [[e for e, _ in many]])["over_cap"] == 1


def test_an_open_session_may_be_covered_by_a_prefix_only():
    evs = events(*range(20))  # the last message 19 minutes ago: open
    ids = [e for e, _ in evs]
    assert coverage(evs, [ids[:15]], now_minutes=38)["open_gaps"] == 0
    assert coverage(evs, [], now_minutes=38)["lost"] == 0
    assert coverage(evs, [ids[15:]], now_minutes=38)["open_gaps"] == 1


def test_a_session_closing_at_the_check_is_neither_required_nor_refused():
    evs = events(0, 1)
    assert coverage(evs, [], now_minutes=31)["sessions_closed"] == 0  # closes at minute 31: the edge
    assert coverage(evs, [], now_minutes=32)["lost"] == 2


def test_the_schedule_is_seeded_spread_and_leaves_both_ends_quiet():
    faults = nemesis.schedule(nemesis.CITUS, 1800, seed=3, rounds=1, quick=False)
    assert faults == nemesis.schedule(nemesis.CITUS, 1800, seed=3, rounds=1, quick=False)
    assert sorted(f.name for f in faults).count("worker-stop") == 2  # a worker stops more than once
    assert {f.name for f in faults} == set(nemesis.CITUS)
    assert all(
        1800 * nemesis.BASELINE_SHARE <= f.at_s <= 1800 * (1 - nemesis.QUIET_END_SHARE) for f in faults
    )
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)


def test_the_history_check_counts_answers_by_phase_and_fault_and_flags_what_must_not_happen():
    history = History()
    add = history.records.append
    for t in range(0, 300, 2):
        add({"op": "search", "t": t, "outcome": "full", "ms": 5.0})
    add({"op": "fault", "fault": "embedder-kill", "t": 100, "healed": 120, "error": ""})
    add({"op": "search", "t": 110, "outcome": "degraded", "reason": "embedder_unavailable", "ms": 4.0})
    add({"op": "similar", "t": 200, "outcome": "rejected", "reason": "NOT_FOUND", "ms": 3.0})
    add({"op": "search", "t": 210, "outcome": "internal", "reason": "INTERNAL", "ms": 3.0})
    add(
        {
            "op": "found",
            "word": "zq1x",
            "started": 250.0,
            "gone_at": 240.0,
            "serve": "a",
            "how": "edit",
            "hits": ["w"],
        }
    )
    add(
        {
            "op": "found",
            "word": "zq2x",
            "started": 230.0,
            "gone_at": 240.0,
            "serve": "a",
            "how": "edit",
            "hits": ["w"],
        }
    )
    figures = checker.check_history(history, 300, warmup_s=10)
    assert figures["per_fault"]["embedder-kill"]["degraded"] == 1
    assert figures["outside_faults"]["rejected"] == 1  # a whole answer: not in the share's denominator
    assert figures["gone_found_after_return"] == 1 and figures["gone_found_before_replay"] == 1
    assert any("internal" in v for v in figures["violations"])
    assert any("gone word" in v for v in figures["violations"])


def test_cancelled_from_the_serve_stopping_is_its_unavailable_and_anywhere_else_internal():
    history = History()
    add = history.records.append
    add({"op": "fault", "fault": "serve-restart", "t": 100.0, "healed": 101.5, "error": ""})
    cancelled = {"op": "search", "outcome": "internal", "reason": "CANCELLED", "ms": 1.6}
    add({**cancelled, "t": 100.0, "serve": "a"})  # gRPC core, the instant serve a stops
    add({**cancelled, "t": 100.5, "serve": "b"})  # b was not stopping
    add({**cancelled, "t": 150.0, "serve": "a"})  # a was not stopping then
    figures = checker.check_history(history, 300, warmup_s=10)
    assert figures["outcomes"] == {"cancelled_at_stop": 1, "internal": 2}
    assert any("2 requests internal" in v for v in figures["violations"])


def test_resources_give_serve_growth_without_its_query_cache_and_check_the_pool_bound():
    history = History()
    add = history.records.append
    for i in range(30):
        t = 60.0 * i
        # RSS grows by the cache alone: 1 MiB a minute of cached query embeddings.
        add(
            {
                "op": "sample",
                "t": t,
                "proc": "serve-b",
                "pid": 7,
                "rss_mib": 80.0 + i,
                "fds": 20,
                "query_cache_mib": float(i),
            }
        )
        serve_conns = 25 if i == 20 else 9
        add({"op": "db", "t": t, "connections": serve_conns + 3, "locks": 10, "waiting": 0,
             "by_app": {"dwsearch-serve": serve_conns, "(none)": 3}, "serves": 2})  # fmt: skip
        # Other jobs, niced, took one core from minute 18 on.
        add(
            {
                "op": "cpu",
                "t": t,
                "hz": 100,
                "busy": 6000 * i,
                "nice": 6000 * max(0, i - 18),
                "steal": 0,
                "idle": 0,
            }
        )
    add({"op": "fault", "fault": "embedder-kill", "t": 600, "healed": 620, "error": ""})
    add({"op": "fault", "fault": "embedder-kill", "t": 1100, "healed": 1120, "error": ""})
    figures = checker.check_history(history, 1800, warmup_s=0)
    cores = figures["machine_cores"]
    assert cores["baseline"] == {"busy": 1.0, "niced": 0.0, "steal": 0.0}
    assert cores["end"]["niced"] == 1.0 and cores["end"]["busy"] == 1.0
    (serve_b,) = figures["resources"]["serve-b"]
    assert serve_b["rss_mib_per_hour"] == 60.0 and serve_b["query_cache_mib_per_hour"] == 60.0
    assert serve_b["rss_less_query_cache_mib_per_hour"] == 0.0 and serve_b["query_cache_mib_last"] == 29.0
    postgres = figures["resources"]["postgres"]
    assert postgres["connections_by_application_max"] == {"(none)": 3, "dwsearch-serve": 25}
    assert postgres["serve_connections_over_pool_bound"] == 1  # 25 > 2 serves x DWSEARCH_DB_POOL_MAX (10)
    assert any("DWSEARCH_DB_POOL_MAX" in v for v in figures["violations"])


def test_a_full_run_bounds_serve_memory_without_its_cache_and_p99_against_its_start():
    held = {"serve_b_rss_mib_per_hour": 9.0, "serve_b_rss_less_query_cache_mib_per_hour": 2.0,
            "p99_outside_faults_over_baseline": 1.5}  # fmt: skip
    assert checker.bounds(held) == []
    leaking = {**held, "serve_b_rss_less_query_cache_mib_per_hour": 8.49}
    assert checker.bounds(leaking) == ["serve b's RSS grew 8.49 MiB an hour after warm-up (< 5)"]
    # Without the cache's size in the samples, the whole RSS is judged.
    assert checker.bounds(
        {"serve_b_rss_mib_per_hour": 5.0, "serve_b_rss_less_query_cache_mib_per_hour": None}
    )
    slow = {**held, "p99_outside_faults_over_baseline": 1.51}
    assert checker.bounds(slow) == ["search p99 outside fault windows 1.51x the fault-free start (<= 1.5x)"]


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(900)
def test_the_short_soak_holds_every_invariant(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--quick", "--minutes", "3", "--out-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    print(done.stdout[-6000:], done.stderr[-3000:])
    result = json.loads((tmp_path / "soak.json").read_text())["one-node"]
    assert result["violations"] == [], result["violations"]
    assert done.returncode == 0
    acceptance = result["acceptance"]
    for name in ("windows_lost", "windows_doubled", "gone_found_after_return", "gone_words_stored",
                 "ineligible_events_in_windows", "cross_org_hits", "hung", "internal"):  # fmt: skip
        assert acceptance[name] == 0, name
    history = result["history"]
    assert {f["fault"] for f in history["faults"]} == set(nemesis.QUICK)
    assert history["probes"] > 0 and result["database"]["gone_words"] > 0  # forgets and purges happened
    model_figures = [v for k, v in result["database"].items() if k.startswith("model ")]
    assert len(model_figures) == 2 and all(m["sessions_closed"] > 0 for m in model_figures)  # the swap built
    assert history["sweeps"]["windows_embedded"] > 0
    assert (tmp_path / "soak-one-node.png").stat().st_size > 10_000
    serve_b = history["resources"]["serve-b"][0]
    assert serve_b["query_cache_mib_last"] > 0 and serve_b["rss_less_query_cache_mib_per_hour"] is not None
    assert history["machine_cores"]["baseline"]["busy"] > 0
    assert history["resources"]["postgres"]["connections_by_application_max"].get("dwsearch-serve", 0) > 0
