"""What must hold after a soak, checked against the database as the run left it and the
recorded history. Every check gives figures; `violations` lists what broke.

The database (once the faults are over and sweeps have settled; `t_check` is the
database's clock at the start of the last sweep round, which embedded nothing):
- every key's eligible events, computed here from dw_chat_events alone, cut into
  sessions at the 30-minute gap: each finished window (any status) of a model holds a
  contiguous run of one session's events, at most 15; no event is in two windows of a
  model; every event of a session closed by `t_check` is in one; in a session still open,
  the windows cover a prefix;
- no window holds an event that is not eligible (denied, verification, deleted), and
  none is of an org whose flags are off;
- no stored window's content holds a gone (edited, deleted or purged) word;
- the sweep's own invariants (dwsearch_testkit.reldb.check_sweep_consistency).

The history: no gone word found by a search that started after its call returned (and the
standby replayed it); no hit of another org or app; no request hung or INTERNAL; shares of
full answers per phase and per fault; latency per phase; the slope of every process's RSS
and descriptors (serve's with and without its query cache, which fills up to its bound by
design), and of Postgres's connections and locks, after warm-up; serve's connections
(by application_name) never above DWSEARCH_DB_POOL_MAX a process."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import psycopg

from bench.report import percentile
from bench.soak.workload import OFF_ORG, History, Ledger
from dwsearch.common.config import ServerConfig
from dwsearch.serve import APPLICATION_NAME as SERVE_APPLICATION
from dwsearch_testkit.reldb import check_sweep_consistency

SESSION_GAP = timedelta(minutes=30)
MAX_WINDOW_MESSAGES = 15
EDGE = timedelta(seconds=15)  # a session closing this near t_check may or may not be swept
ANSWERS = ("search", "similar", "context")
GRACE_S = 15.0  # after a fault heals, the breakers close and pools refill
POOL_LINGER_S = 600.0  # pgbouncer's server_idle_timeout
# A full run's bounds on the service (issue 49's acceptance): serve b's memory, less the
# query cache that fills to its configured size by design, grows less than this after
# warm-up; search p99 outside fault windows stays within this of the fault-free start.
RSS_MIB_PER_HOUR_MAX = 5.0
P99_OVER_BASELINE_MAX = 1.5
DB_POOL_MAX = next(
    f.default for f in dataclasses.fields(ServerConfig) if f.name == "db_pool_max"
)  # the soak's serves


def check_database(url: str, models: list[str], t_check: datetime, ledger: Ledger) -> dict[str, Any]:
    out: dict[str, Any] = {"violations": []}
    violations: list[str] = out["violations"]
    try:
        check_sweep_consistency(url, purged=True)
    except AssertionError as exc:
        violations.append(f"sweep consistency: {str(exc)[:500]}")
    with psycopg.connect(url) as conn:
        events = conn.execute(
            """SELECT id::text, org_id, provider, external_channel_id, created_at FROM dw_chat_events
               WHERE event_type = 'message' AND decision IN ('received', 'processed')
               ORDER BY org_id, provider, external_channel_id, created_at, id"""
        ).fetchall()
        windows = conn.execute(
            """SELECT id::text, org_id, provider, external_channel_id, model, status, source_message_ids::text[]
               FROM dw_sweep_windows"""
        ).fetchall()
        (ineligible,) = conn.execute(
            """SELECT count(DISTINCT w.id) FROM dw_sweep_windows w
               JOIN dw_chat_events e ON e.org_id = w.org_id AND e.id = ANY(w.source_message_ids)
               WHERE NOT (e.event_type = 'message' AND e.decision IN ('received', 'processed'))"""
        ).fetchone() or (0,)
        words = sorted(ledger.gone)
        gone_stored = 0
        if words:
            (gone_stored,) = conn.execute(
                "SELECT count(*) FROM dw_message_embeddings WHERE content LIKE ANY(%s)",
                ([f"%{w}%" for w in words],),
            ).fetchone() or (0,)
        statuses = dict(
            conn.execute("SELECT status, count(*) FROM dw_sweep_windows GROUP BY status").fetchall()
        )
    keys: dict[tuple[str, str, str], list[tuple[str, datetime]]] = defaultdict(list)
    for event_id, org, provider, channel, created in events:
        keys[(org, provider, channel)].append((event_id, created))
    out["eligible_events"] = len(events)
    out["windows_by_status"] = statuses
    out["ineligible_events_in_windows"] = ineligible
    out["gone_words"] = len(words)
    out["gone_words_stored"] = gone_stored
    if ineligible:
        violations.append(f"{ineligible} windows hold an ineligible event (denied, verification or deleted)")
    if gone_stored:
        violations.append(f"{gone_stored} stored windows hold an edited, deleted or purged message's word")
    by_model: dict[str, dict[tuple[str, str, str], list[tuple[str, list[str]]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    off = 0
    for window_id, org, provider, channel, model, _, ids in windows:
        if org == OFF_ORG:
            off += 1
        by_model[model][(org, provider, channel)].append((window_id, ids))
    out["windows_of_flags_off_org"] = off
    if off:
        violations.append(f"{off} windows of {OFF_ORG}, whose semantic-search flag is off")
    for model in models:
        figures = _model_coverage(keys, by_model.get(model, {}), t_check)
        out[f"model {model}"] = figures
        for name in (
            "lost",
            "doubled",
            "not_contiguous",
            "across_sessions",
            "over_cap",
            "stale",
            "open_gaps",
        ):
            if figures[name]:
                violations.append(
                    f"{model}: {figures[name]} {name.replace('_', ' ')} (examples: {figures['examples'][:3]})"
                )
    return out


def _model_coverage(
    keys: dict[tuple[str, str, str], list[tuple[str, datetime]]],
    windows: dict[tuple[str, str, str], list[tuple[str, list[str]]]],
    t_check: datetime,
) -> dict[str, Any]:
    counts = Counter[str]()
    figures: dict[str, Any] = Counter()
    examples: list[str] = []
    for key, key_windows in windows.items():
        events = keys.get(key, [])
        index = {event_id: i for i, (event_id, _) in enumerate(events)}
        session_of = _sessions(events)
        for window_id, ids in key_windows:
            counts.update(ids)
            if any(i not in index for i in ids):
                figures["stale"] += 1
                examples.append(f"stale {window_id}")
                continue
            places = [index[i] for i in ids]
            if places != list(range(places[0], places[0] + len(places))):
                figures["not_contiguous"] += 1
                examples.append(f"not contiguous {window_id}")
            if len({session_of[p] for p in places}) > 1:
                figures["across_sessions"] += 1
            if len(ids) > MAX_WINDOW_MESSAGES:
                figures["over_cap"] += 1
    figures["windows"] = sum(len(w) for w in windows.values())
    figures["doubled"] = sum(1 for n in counts.values() if n > 1)
    if figures["doubled"]:
        examples += [f"doubled {i}" for i, n in counts.items() if n > 1][:3]
    for key, events in keys.items():
        if key[0] == OFF_ORG:
            continue
        session_of = _sessions(events)
        for session in sorted(set(session_of)):
            members = [events[i] for i, s in enumerate(session_of) if s == session]
            following = next((events[i][1] for i, s in enumerate(session_of) if s == session + 1), None)
            closes_at = members[-1][1] + SESSION_GAP
            covered = [counts[event_id] > 0 for event_id, _ in members]
            if following is not None or closes_at <= t_check - EDGE:
                figures["sessions_closed"] += 1
                missing = covered.count(False)
                figures["lost"] += missing
                if missing:
                    examples.append(f"lost {missing} of {key} session {session}")
            elif closes_at >= t_check + EDGE:
                figures["sessions_open"] += 1
                first_gap = covered.index(False) if False in covered else len(covered)
                if any(covered[first_gap:]):
                    figures["open_gaps"] += 1
    figures["examples"] = examples[:10]
    for name in ("lost", "doubled", "not_contiguous", "across_sessions", "over_cap", "stale", "open_gaps",
                 "sessions_closed", "sessions_open"):  # fmt: skip
        figures.setdefault(name, 0)
    return dict(figures)


def _sessions(events: list[tuple[str, datetime]]) -> list[int]:
    out, session = [], 0
    for i, (_, created) in enumerate(events):
        if i and created - events[i - 1][1] >= SESSION_GAP:
            session += 1
        out.append(session)
    return out


# --- the history --------------------------------------------------------------------------------


def in_fault(t: float, faults: list[tuple[str, float, float]]) -> str | None:
    return next((name for name, start, end in faults if start <= t <= end), None)


def check_history(history: History, duration_s: float, warmup_s: float) -> dict[str, Any]:
    records = history.records
    faults = [(r["fault"], r["t"], r["healed"] + GRACE_S) for r in records if r.get("op") == "fault"]
    first = min((f[1] for f in faults), default=duration_s)
    last = max((f[2] for f in faults), default=duration_s)
    violations: list[str] = []
    out: dict[str, Any] = {"violations": violations, "faults": [
        {"fault": r["fault"], "t": r["t"], "healed": r["healed"], "error": r.get("error", "")}
        for r in records if r.get("op") == "fault"]}  # fmt: skip
    for r in records:
        if r.get("op") == "fault" and r.get("error"):
            violations.append(
                f"fault {r['fault']} at {r['t']:.0f}s could not be applied or healed: {r['error']}"
            )
        if r.get("op") == "harness":
            violations.append(f"harness: {r.get('part', '')} {r.get('error', '')}")

    found = [r for r in records if r.get("op") == "found" and r["started"] >= r["gone_at"]]
    out["gone_found_after_return"] = len(found)
    out["gone_found_before_replay"] = sum(1 for r in records if r.get("op") == "found") - len(found)
    out["probes"] = sum(1 for r in records if r.get("op") == "probe")
    if found:
        violations.append(f"{len(found)} searches found a gone word after its call returned: {found[:3]}")
    foreign = [r for r in records if r.get("foreign")]
    out["cross_org_hits"] = len(foreign)
    if foreign:
        violations.append(f"{len(foreign)} answers held another org's or app's hits: {foreign[:3]}")

    requests = [r for r in records if r.get("op") in (*ANSWERS, "probe", "upsert", "forget", "purge")]
    _cancelled_at_stop(requests, records)
    outcomes = Counter(r["outcome"] for r in requests)
    out["requests"] = len(requests)
    out["outcomes"] = dict(outcomes)
    for bad in ("hung", "internal"):
        if outcomes.get(bad):
            examples = [
                (r["op"], round(r["t"]), r.get("reason"), r.get("detail", ""))
                for r in requests
                if r["outcome"] == bad
            ]
            violations.append(f"{outcomes[bad]} requests {bad}: {examples[:5]}")
    out["slowest_answer_ms"] = round(max((r["ms"] for r in requests), default=0.0), 1)

    answers = [r for r in records if r.get("op") in ANSWERS]

    def share(rs: list[dict[str, Any]]) -> dict[str, Any]:
        n = len(rs)
        c = Counter(r["outcome"] for r in rs)
        answerable = n - c["rejected"]  # NOT_FOUND for a message since deleted is a whole answer
        reasons = Counter(r.get("reason") or "?" for r in rs if r["outcome"] == "degraded")
        return {"requests": n, "full_share": round(c["full"] / answerable, 4) if answerable else None, **dict(c),
                "degraded_reasons": dict(reasons)}  # fmt: skip

    phases = {
        "baseline": lambda t: warmup_s <= t < first,
        "faults": lambda t: first <= t < last,
        "end": lambda t: t >= last,
    }
    out["phases"] = {name: share([r for r in answers if test(r["t"])]) for name, test in phases.items()}
    out["machine_cores"] = {name: _cores([r for r in records if r.get("op") == "cpu" and test(r["t"])])
                            for name, test in phases.items()}  # fmt: skip
    outside = [r for r in answers if r["t"] >= warmup_s and in_fault(r["t"], faults) is None]
    out["outside_faults"] = share(outside)
    per_fault: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in answers:
        name = in_fault(r["t"], faults)
        if name:
            per_fault[name].append(r)
    out["per_fault"] = {name: share(rs) for name, rs in sorted(per_fault.items())}
    full_share = out["outside_faults"]["full_share"]
    if full_share is not None and full_share < 0.995:
        violations.append(f"outside fault windows {full_share:.4f} of answers in full (< 0.995)")

    def latency(rs: list[dict[str, Any]]) -> dict[str, Any]:
        ms = [r["ms"] for r in rs if r.get("op") == "search" and r["outcome"] in ("full", "degraded")]
        return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 1), "p99_ms": round(percentile(ms, 99), 1)}

    out["latency"] = {name: latency([r for r in answers if test(r["t"])]) for name, test in phases.items()}
    out["latency"]["outside_faults"] = latency(outside)
    out["latency"]["per_fault"] = {name: latency(rs) for name, rs in sorted(per_fault.items())}
    base = out["latency"]["baseline"]["p99_ms"]
    ratio = out["latency"]["outside_faults"]["p99_ms"] / base if base and base == base else None
    out["p99_outside_faults_over_baseline"] = round(ratio, 2) if ratio else None

    out["resources"] = _resources(records, warmup_s)
    over = out["resources"].get("postgres", {}).get("serve_connections_over_pool_bound")
    if over:
        violations.append(
            f"serve held more than DWSEARCH_DB_POOL_MAX ({DB_POOL_MAX}) connections a process in {over} samples"
        )
    out["sweeps"] = _sweeps(records)
    out["knn_indexes"] = [
        {"t": round(r["t"]), "rc": r["rc"], "min_windows": r.get("min_windows"), "out": r["out"][-160:]}
        for r in records
        if r.get("op") == "knn"
    ]
    return out


def _cancelled_at_stop(requests: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """A call that reaches a gRPC server in the instant it stops, before a handler has
    taken it, is answered CANCELLED by gRPC core rather than UNAVAILABLE (grpc/grpc#41785,
    open): on serve a, inside a serve-restart fault, such an answer is the stop's
    UNAVAILABLE, counted apart as `cancelled_at_stop` (the history keeps the code)."""
    stops = [
        (r["t"], r["healed"]) for r in records if r.get("op") == "fault" and r["fault"] == "serve-restart"
    ]
    for r in requests:
        if (
            r["outcome"] == "internal"
            and r.get("reason") == "CANCELLED"
            and r.get("serve") == "a"
            and any(t <= r["t"] <= healed for t, healed in stops)
        ):
            r["outcome"] = "cancelled_at_stop"


def bounds(acceptance: dict[str, Any]) -> list[str]:
    """Violations of the full run's bounds on memory and latency (a quick run is too short
    for slopes and takes no timings: it checks the invariants only)."""
    violations = []
    rss = acceptance.get("serve_b_rss_less_query_cache_mib_per_hour")
    if rss is None:
        rss = acceptance.get("serve_b_rss_mib_per_hour")
    if rss is not None and rss >= RSS_MIB_PER_HOUR_MAX:
        violations.append(
            f"serve b's RSS grew {rss:.2f} MiB an hour after warm-up (< {RSS_MIB_PER_HOUR_MAX:g})"
        )
    ratio = acceptance.get("p99_outside_faults_over_baseline")
    if ratio is not None and ratio > P99_OVER_BASELINE_MAX:
        violations.append(
            f"search p99 outside fault windows {ratio:.2f}x the fault-free start (<= {P99_OVER_BASELINE_MAX:g}x)"
        )
    return violations


def _cores(samples: list[dict[str, Any]]) -> dict[str, float] | None:
    """Cores busy over the samples' span, from /proc/stat's counters: `busy` at normal
    priority (the stack, the workload, anything else unniced), `niced` (other jobs run
    niced), `steal` (the hypervisor's other guests)."""
    if len(samples) < 2 or samples[-1]["t"] <= samples[0]["t"]:
        return None
    first, last = samples[0], samples[-1]
    seconds = (last["t"] - first["t"]) * last["hz"]
    return {key: round((last[field] - first[field]) / seconds, 2)
            for key, field in (("busy", "busy"), ("niced", "nice"), ("steal", "steal"))}  # fmt: skip


def _slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 5:
        return None
    t, y = np.array(points).T
    if t[-1] - t[0] < 60:
        return None
    return float(np.polyfit(t / 3600.0, y, 1)[0])


def _resources(records: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    samples: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("op") == "sample" and r["t"] >= warmup_s:
            samples[(r["proc"], r["pid"])].append(r)
    for (name, pid), rs in sorted(samples.items(), key=lambda kv: (kv[0][0], kv[1][0]["t"])):
        entry = {
            "pid": pid,
            "from_s": round(rs[0]["t"]),
            "to_s": round(rs[-1]["t"]),
            "rss_mib_first": rs[0]["rss_mib"],
            "rss_mib_last": rs[-1]["rss_mib"],
            "rss_mib_max": max(r["rss_mib"] for r in rs),
            "rss_mib_per_hour": _round(_slope_per_hour([(r["t"], r["rss_mib"]) for r in rs])),
            "fds_first": rs[0]["fds"],
            "fds_last": rs[-1]["fds"],
            "fds_max": max(r["fds"] for r in rs),
            "fds_per_hour": _round(_slope_per_hour([(r["t"], r["fds"]) for r in rs])),
        }
        cached = [r for r in rs if r.get("query_cache_mib") is not None]
        if cached:
            # The query-embedding cache fills up to DWSEARCH_QUERY_CACHE_BYTES by design:
            # its growth is reported beside the rest of the process's.
            entry["query_cache_mib_last"] = cached[-1]["query_cache_mib"]
            entry["query_cache_mib_per_hour"] = _round(
                _slope_per_hour([(r["t"], r["query_cache_mib"]) for r in cached])
            )
            entry["rss_less_query_cache_mib_per_hour"] = _round(
                _slope_per_hour([(r["t"], r["rss_mib"] - r["query_cache_mib"]) for r in cached])
            )
        out.setdefault(name, []).append(entry)
    db = [
        r for r in records if r.get("op") == "db" and r.get("connections") is not None and r["t"] >= warmup_s
    ]
    if db:
        out["postgres"] = {
            "connections_max": max(r["connections"] for r in db),
            "connections_per_hour": _round(_slope_per_hour([(r["t"], r["connections"]) for r in db])),
            "locks_max": max(r["locks"] for r in db),
            "locks_per_hour": _round(_slope_per_hour([(r["t"], r["locks"]) for r in db])),
            "waiting_max": max(r["waiting"] for r in db),
        }
        by_app = [r for r in db if r.get("by_app") is not None]
        if by_app:
            apps = sorted({app for r in by_app for app in r["by_app"]})
            out["postgres"]["connections_by_application_max"] = {
                app: max(r["by_app"].get(app, 0) for r in by_app) for app in apps
            }
            # serve's pool on the primary holds at most DWSEARCH_DB_POOL_MAX connections a
            # process: bounded by the serves running in the last POOL_LINGER_S (pgbouncer
            # keeps a server connection idle for its server_idle_timeout, under the name its
            # last client gave, after that client has gone).
            over = [
                r
                for r in by_app
                if r["by_app"].get(SERVE_APPLICATION, 0)
                > DB_POOL_MAX * max(q["serves"] for q in by_app if r["t"] - POOL_LINGER_S <= q["t"] <= r["t"])
            ]
            out["postgres"]["serve_connections_over_pool_bound"] = len(over)
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _sweeps(records: list[dict[str, Any]]) -> dict[str, Any]:
    sweeps = [r for r in records if r.get("op") == "sweep"]
    return {
        "calls": len(sweeps),
        "failed": sum(1 for r in sweeps if r["rc"] != 0),
        "windows_embedded": sum(r["embedded"] for r in sweeps),
        "windows_dropped": sum(r["dropped"] for r in sweeps),
        "windows_poisoned": sum(r["poisoned"] for r in sweeps),
        "keys_stalled": sum(r["stalled"] for r in sweeps),
        "keys_left_to_another_sweeper": sum(r["locked"] for r in sweeps),
        "longest_s": round(max((r["ms"] for r in sweeps), default=0) / 1000, 1),
        "errors": Counter(r["error"][:120] for r in sweeps if r["rc"] != 0).most_common(5),
    }


def utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)
