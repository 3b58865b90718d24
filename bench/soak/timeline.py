"""The soak's timeline picture: search latency, errors and degradations, the sweep's
backlog and every process's RSS over the run, with each fault marked where it happened."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"full": "#4c72b0", "degraded": "#dd8452", "rejected": "#8c8c8c", "unavailable": "#c44e52",
          "internal": "#000000", "hung": "#8b008b"}  # fmt: skip
BIN_S = 10.0


def draw(records: list[dict[str, Any]], path: Path, title: str) -> Path:
    minutes = lambda t: t / 60  # noqa: E731
    fig, axes = plt.subplots(4, 1, figsize=(13, 11), sharex=True, constrained_layout=True)
    latency, outcomes, backlog, memory = axes
    searches = [r for r in records if r.get("op") in ("search", "similar", "context")]
    for outcome, color in COLORS.items():
        rs = [r for r in searches if r["outcome"] == outcome]
        if rs:
            latency.scatter([minutes(r["t"]) for r in rs], [max(r["ms"], 0.5) for r in rs], s=3, c=color,
                            label=f"{outcome} ({len(rs)})", alpha=0.6, linewidths=0)  # fmt: skip
    latency.set_yscale("log")
    latency.set_ylabel("latency (ms)\nsearch, similar, agent context")
    latency.legend(loc="upper left", fontsize=8, markerscale=3, ncol=6)

    bins: dict[str, Counter[int]] = {o: Counter() for o in COLORS if o != "full"}
    for r in searches:
        if r["outcome"] in bins:
            bins[r["outcome"]][int(r["t"] // BIN_S)] += 1
    bottom: Counter[int] = Counter()
    for outcome, counts in bins.items():
        if counts:
            xs = sorted(counts)
            outcomes.bar([minutes(x * BIN_S) for x in xs], [counts[x] for x in xs], width=BIN_S / 60,
                         bottom=[bottom[x] for x in xs], color=COLORS[outcome], label=outcome, align="edge")  # fmt: skip
            for x in xs:
                bottom[x] += counts[x]
    outcomes.set_ylabel(f"answers not in full\nper {BIN_S:.0f} s")
    if any(bins.values()):
        outcomes.legend(loc="upper left", fontsize=8)

    db = [r for r in records if r.get("op") == "db" and r.get("connections") is not None]
    backlog.plot(
        [minutes(r["t"]) for r in db],
        [r["backlog"] for r in db],
        color="#55a868",
        label="events pending (sweep)",
    )
    backlog.set_ylabel("sweep backlog\n(events)")
    twin = backlog.twinx()
    twin.plot([minutes(r["t"]) for r in db], [r["connections"] for r in db], color="#8172b3", lw=0.8,
              label="Postgres connections")  # fmt: skip
    twin.set_ylabel("connections")
    backlog.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)

    by_proc: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r.get("op") == "sample":
            by_proc.setdefault(r["proc"], []).append((minutes(r["t"]), r["rss_mib"]))
    for name, points in sorted(by_proc.items()):
        memory.plot(*zip(*points, strict=True), lw=1, label=name)
    memory.set_yscale("log")
    memory.set_ylabel("RSS (MiB)")
    memory.set_xlabel("minutes")
    memory.legend(loc="upper left", fontsize=8, ncol=6)

    for r in records:
        if r.get("op") == "fault":
            for ax in axes:
                ax.axvspan(
                    minutes(r["t"]), minutes(max(r["healed"], r["t"] + 3)), color="#c44e52", alpha=0.12
                )
            latency.annotate(r["fault"], (minutes(r["t"]), 1.0), xycoords=("data", "axes fraction"),
                             rotation=90, fontsize=7, va="top", ha="right", color="#8b0000")  # fmt: skip
        if r.get("op") == "swap":
            for ax in axes:
                ax.axvline(minutes(r["t"]), color="#2f4f4f", ls="--", lw=0.8)
    fig.suptitle(title)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
