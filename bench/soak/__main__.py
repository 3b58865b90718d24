"""A day of production in an hour: dwsearch run as a service under its workload and a
schedule of faults, then checked (bench.soak.checker).

    python -m bench.soak [--minutes 60] [--citus-workers 2] [--quick] [--seed N]
    make soak            # one node, 60 minutes
    make soak-citus      # two Citus workers, 60 minutes

Writes the run's figures into bench/results/soak.json under its topology (`one-node`,
`citus-2`; `--quick` runs go to --out-dir only) and its timeline picture into
docs/img/soak-<topology>.png, where the docs show it; the whole history as JSON lines in the work directory. Exits 1
when anything that must hold did not."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.soak import checker, nemesis, timeline
from bench.soak.stack import Stack
from bench.soak.workload import FULL, QUICK, History, Workload

SETTLE_ROUNDS = 10
ROOT = Path(__file__).resolve().parents[2]
DOCS_IMG = ROOT / "docs" / "img"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=0, help="length of the load (default 60, quick 4)")
    p.add_argument("--citus-workers", type=int, default=0, help="a local Citus cluster of this many workers")
    p.add_argument("--quick", action="store_true", help="the fake embedder, small sizes, a few faults")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out-dir", type=Path, default=None, help="where soak.json and the picture go")
    args = p.parse_args(argv)
    minutes = args.minutes or (4 if args.quick else 60)
    topology = f"citus-{args.citus_workers}" if args.citus_workers else "one-node"
    profile = QUICK if args.quick else FULL
    stack = Stack(quick=args.quick, citus_workers=args.citus_workers)
    # A SIGTERM (a stopped job, `kill`) closes the stack as Ctrl-C does: no process is left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out_dir = args.out_dir or (stack.work if args.quick else report.RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"soak: {topology}, {minutes:g} min, work directory {stack.work}", flush=True)
    try:
        stack.start()
        history = History()
        workload = Workload(stack, profile, history, args.seed, minutes)
        seeded = workload.seed_history()
        workload.seed_documents()
        print(f"soak: stack up, {seeded} events of history; the load starts", flush=True)
        duration_s = minutes * 60
        names = nemesis.QUICK if args.quick else nemesis.CITUS if args.citus_workers else nemesis.ONE_NODE
        faults = nemesis.schedule(
            names, duration_s, args.seed, rounds=1 if args.quick else 2, quick=args.quick
        )
        history.started = time.monotonic()
        workload.start()
        workload.sample_forever()
        fury = nemesis.Nemesis(stack, history, faults)
        fury.start()
        swap_at = duration_s * 0.35
        threading.Timer(swap_at, _swap, args=(stack, history)).start()
        _wait_reporting(history, duration_s)
        workload.stop.set()
        fury.stop.set()
        fury.thread.join(300)
        workload.join()
        t_check = _settle(stack, workload, history)
        models = [stack.model_a] + ([stack.model_b] if "c" in stack.serves else [])
        db = checker.check_database(stack.primary_url, models, t_check, workload.ledger)
        warmup_s = min(120.0, duration_s * 0.1)
        figures = checker.check_history(history, duration_s, warmup_s)
        history.dump(stack.work / "history.jsonl")
        result = _result(topology, minutes, args, stack, seeded, db, figures)
        pictures = out_dir if args.out_dir or args.quick else DOCS_IMG  # the docs site shows them
        picture = timeline.draw(history.records, pictures / f"soak-{topology}.png",
                                f"dwsearch soak, {topology}, {minutes:g} min ({report.machine()['cpu_class']})")  # fmt: skip
        result["timeline"] = str(picture.relative_to(ROOT)) if picture.is_relative_to(ROOT) else picture.name
        _write(out_dir / "soak.json", topology, result)
        violations = result["violations"]
        print(json.dumps({k: v for k, v in result.items() if k in ("acceptance", "violations")}, indent=2))
        print(f"soak: {len(violations)} violation(s); history in {stack.work / 'history.jsonl'}")
        return 1 if violations else 0
    finally:
        stack.close()


def _swap(stack: Stack, history: History) -> None:
    """The model swap's first step, part-way: model B's embedder and serve, building while
    search stays on model A."""
    started = history.now()
    try:
        stack.start_swap()
        history.add(op="swap", t=round(started, 3), ready=round(history.now(), 3), model=stack.model_b)
    except Exception as exc:
        history.add(op="harness", part="swap", error=repr(exc)[:300])


def _wait_reporting(history: History, duration_s: float) -> None:
    while (left := duration_s - history.now()) > 0:
        time.sleep(min(60.0, left))
        answers = [r for r in history.records[-2000:] if r.get("op") in ("search", "similar", "context")]
        full = sum(1 for r in answers if r["outcome"] == "full")
        faults = sum(1 for r in history.records if r.get("op") == "fault")
        print(f"soak: {history.now() / 60:5.1f} min, {len(history.records)} records, {faults} faults so far, "
              f"recent answers {full}/{len(answers)} in full", flush=True)  # fmt: skip


def _settle(stack: Stack, workload: Workload, history: History) -> Any:
    """Sweep every model until a round embeds nothing and nothing stalls; the database's
    clock at the start of that round is when the checker's closed sessions end."""
    from bench.soak.checker import utc

    serves = ["a"] + (["c"] if "c" in stack.serves else [])
    for _ in range(SETTLE_ROUNDS):
        t_check = utc(stack.db_now())
        results = [workload.sweep(serve) for serve in serves]
        if all(r["rc"] == 0 and r["embedded"] == 0 and r["stalled"] == 0 for r in results):
            return t_check
    history.add(op="harness", part="settle", error=f"sweeps still working after {SETTLE_ROUNDS} rounds")
    return t_check


def _result(topology: str, minutes: float, args: argparse.Namespace, stack: Stack, seeded: int,
            db: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    violations = db["violations"] + figures["violations"]
    models = {k: v for k, v in db.items() if k.startswith("model ")}
    serve_b = (figures["resources"].get("serve-b") or [{}])[0]
    acceptance = {
        "windows_lost": sum(m["lost"] for m in models.values()),
        "windows_doubled": sum(m["doubled"] for m in models.values()),
        "gone_found_after_return": figures["gone_found_after_return"],
        "gone_words_stored": db["gone_words_stored"],
        "ineligible_events_in_windows": db["ineligible_events_in_windows"],
        "cross_org_hits": figures["cross_org_hits"],
        "hung": figures["outcomes"].get("hung", 0),
        "internal": figures["outcomes"].get("internal", 0),
        "cancelled_at_stop": figures["outcomes"].get("cancelled_at_stop", 0),
        "full_share_outside_faults": figures["outside_faults"]["full_share"],
        "serve_b_rss_mib_per_hour": serve_b.get("rss_mib_per_hour"),
        "serve_b_rss_less_query_cache_mib_per_hour": serve_b.get("rss_less_query_cache_mib_per_hour"),
        "serve_b_fds_per_hour": serve_b.get("fds_per_hour"),
        "postgres_connections_per_hour": figures["resources"].get("postgres", {}).get("connections_per_hour"),
        "serve_connections_over_pool_bound": figures["resources"]
        .get("postgres", {})
        .get("serve_connections_over_pool_bound"),
        "p99_outside_faults_over_baseline": figures["p99_outside_faults_over_baseline"],
    }
    if not args.quick:
        violations += checker.bounds(acceptance)
    return {
        "topology": topology,
        "minutes": minutes,
        "quick": args.quick,
        "seed": args.seed,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": report.machine(),
        "stack": {
            "pgbouncer": stack.pgbouncer,
            "read_replica": bool(stack.read_url),
            "model_a": stack.model_a,
            "model_b": stack.model_b,
            "history_events": seeded,
        },
        "acceptance": acceptance,
        "violations": violations,
        "database": db,
        "history": figures,
    }


def _write(path: Path, topology: str, result: dict[str, Any]) -> None:
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[topology] = result
    path.write_text(json.dumps(existing, indent=2, default=str, ensure_ascii=False) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    sys.exit(main())
