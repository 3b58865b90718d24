"""docs/benchmarks.md, rendered from bench/results/*.json: each benchmark's figures with the
command that measured them, the machine's CPU model and class, and the date.

    python -m bench.pages            # print the page
    python -m bench.pages --write    # write docs/benchmarks.md (`make docs` does, by docs/generate.py)

The shapes it renders: a file of bench.report.write (benchmark, measured_at, machine, params,
figures); a file keyed by topology, section or commit whose values are such results or the
soak's (acceptance, violations, history); a list of such results. Any other file is listed
as not rendered. The page depends on the files alone: the same files give the same bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from bench.report import RESULTS_DIR

# Pictures the docs show (the soak's timelines), beside this page in docs/.
IMAGES_DIR = RESULTS_DIR.parents[1] / "docs" / "img"

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
CAP = 24  # a parameter holding more values than this is left to the JSON file

# Per results file (or per module): a title for the index, and what the benchmark measures.
ABOUT = {
    "embedder": (
        "Embedder under load",
        "The embedder service through gRPC: batched throughput against the same texts encoded in-process, "
        "a query's latency while bulk embedding saturates it, torch against ONNX Runtime at bge-m3's "
        "full size, and the OpenAI-compatible HTTP port against gRPC.",
    ),
    "index": (
        "Index queries and agent context",
        "IndexService latency: agent context's filtered hybrid queries and BuildAgentContext through gRPC "
        "and through the Upstash-compatible REST API, against the raw SQL of one filtered hybrid query "
        "measured in the same run.",
    ),
    "onnx_fullsize": (
        "torch vs ONNX Runtime, bge-m3 size",
        "The embedder's backends in-process on bge-m3's shape (random weights): torch float32, ONNX "
        "Runtime float32 and int8, each its load time, one query's latency, a batch's throughput, peak "
        "memory and agreement with torch.",
    ),
    "onnx_minilm": (
        "torch vs ONNX Runtime, MiniLM",
        "The same comparison as onnx_fullsize on all-MiniLM-L6-v2: torch float32, ONNX Runtime float32 "
        "and int8.",
    ),
    "quality": (
        "Retrieval quality",
        "hit@1/3/10, MRR and nDCG@10 of Search on a labelled chat set in English, Malay, Chinese and "
        "rojak, per search mode and embedding backend, and Similar's task: another conversation of the "
        "same topic among the top 3.",
    ),
    "rest": (
        "REST API, large bodies",
        "How long one fetch of many large vectors holds the other requests on the REST port, and serve's "
        "peak memory over a large upsert.",
    ),
    "search": (
        "Search latency",
        "Hybrid and semantic Search through gRPC against the raw SQL they wrap, measured in the same run; "
        "the lexical leg, Zipf-distributed chat text and the CPU time per search.",
    ),
    "soak": (
        "Soak: production under faults",
        "dwsearch run as a service under a production-like workload and a seeded schedule of faults "
        "(processes killed, frozen, restarted), then checked for what must hold.",
    ),
    "sweep": (
        "Sweep throughput",
        "A backfill of chat messages against a fake embedder in its own process, and against a real "
        "MiniLM embedder compared with embedding the same chunks directly.",
    ),
    "sweep_load": (
        "Search during a sweep",
        "The share of hybrid Search answers that stay semantic (not degraded to full text) while a sweep "
        "embeds a backlog, with searches at half the embedder's query capacity.",
    ),
    "tenancy": (
        "Many tenants on one node",
        "Search, sweep and memory at 10,000 orgs and 100,000 sweep keys, each against the same code at 50 "
        "orgs in the same run; also with partitioned events and on a two-worker Citus cluster.",
    ),
}
# Figures a results file holds too many of for the page: (those shown, what they are).
SHOWN = {
    "quality": (
        re.compile(r"errors_logged|[^.]+\.(fts|semantic|hybrid|similar)\.(all|cross_lingual)\.[^.]+"),
        "each backend and mode over all queries and over the cross-lingual ones; those per "
        "language, per subset, per dev/test part and per fusion leg are in the JSON file",
    ),
}


def render(results_dir: Path = RESULTS_DIR, images_dir: Path = IMAGES_DIR) -> str:
    """The whole of docs/benchmarks.md."""
    index = ["| Benchmark | What | Measured | CPU |", "|---|---|---|---|"]
    body: list[str] = []
    for path in sorted(results_dir.glob("*.json")):
        name, module = path.stem, _module(path.stem)
        title, about = ABOUT.get(name) or ABOUT.get(module) or ("", "")
        runs = _runs(_load(path))
        source = _source(module)
        body += [f"## {name}", "", about, ""] if about else [f"## {name}", ""]
        if runs is None:
            index.append(f"| [{name}](#{_slug(name)}) | not rendered | – | – |")
            body += [f"`bench/results/{path.name}` is not in a shape this page renders; read the file.", ""]
            continue
        meaning = (
            f"; the docstring of `{source.relative_to(ROOT)}` says what each one means" if source else ""
        )
        body += [f"Figures from `bench/results/{path.name}`{meaning}.", ""]
        dates = sorted({str(run.get("measured_at", ""))[:10] for run in runs.values()} - {""})
        cpus = list(dict.fromkeys(_cpu(run) for run in runs.values()))
        index.append(
            f"| [{name}](#{_slug(name)}) | {_md(title)} | {', '.join(dates) or '–'} | {'; '.join(cpus)} |"
        )
        for label, run in runs.items():
            body += [f"### {label}", ""] if label else []
            body += _run(module, label, run, images_dir)
    head = [
        "<!-- Generated by `make docs` (bench/pages.py) from bench/results/*.json. Do not edit by hand. -->",
        "",
        "# Benchmarks",
        "",
        "Generated from `bench/results/*.json` by `make docs`; rerun a benchmark, then `make docs`, "
        "never edit this page by hand.",
        "",
        "Each benchmark is a command, `python -m bench.<name>` (`--quick` for a smoke run), that "
        "prints its figures and writes them to `bench/results/<name>.json`; this page shows the "
        "latest of each, with the command, the machine's CPU model and CPU class (the class "
        "decides which int8 kernels run) and the date. Machines are noisy, so most targets are "
        "ratios against a baseline measured in the same run.",
        "",
    ]
    return "\n".join(head + index + [""] + body).rstrip("\n") + "\n"


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _runs(data: Any) -> dict[str, dict[str, Any]] | None:
    """The file's results by label ("" for a file of one run), or None for a shape not known."""

    def one(v: Any) -> bool:
        return isinstance(v, dict) and any(isinstance(v.get(k), dict) for k in ("figures", "acceptance"))

    if isinstance(data, dict) and isinstance(data.get("figures"), dict):
        return {"": data}
    if isinstance(data, list) and data and all(one(v) for v in data):
        return {str(v.get("commit") or f"run {i}"): v for i, v in enumerate(data, 1)}
    if isinstance(data, dict) and data and all(one(v) for v in data.values()):
        return {str(k): v for k, v in data.items()}
    return None


def _dict(d: dict[str, Any], key: str) -> dict[str, Any]:
    return d[key] if isinstance(d.get(key), dict) else {}


def _module(name: str) -> str:
    module = re.sub(r"[-_]quick$", "", name)
    return "onnx" if module.startswith("onnx_") else module


def _source(module: str) -> Path | None:
    for path in (ROOT / "bench" / f"{module}.py", ROOT / "bench" / module / "__main__.py"):
        if path.is_file():
            return path
    return None


def _run(module: str, label: str, run: dict[str, Any], images_dir: Path) -> list[str]:
    params = _dict(run, "params")
    out = ["```sh", _command(module, label, run), "```", ""]
    date = str(run.get("measured_at", ""))[:10] or "at a date not recorded"
    out += [f"Measured {date} on {_cpu(run)}.", ""]
    parts = params.get("section_measured_at") or {
        k: v["measured_at"]
        for k, v in _dict(params, "runs").items()
        if isinstance(v, dict) and v.get("measured_at")
    }
    if {str(v)[:10] for v in parts.values()} - {date}:
        out += ["Measured in parts: " + ", ".join(f"{k} {str(v)[:10]}" for k, v in parts.items()) + ".", ""]  # fmt: skip
    if isinstance(run.get("acceptance"), dict):
        return out + _soak(label, run, images_dir)
    figures = _flat(run["figures"])
    shown = SHOWN.get(module)
    if shown:
        kept = {k: v for k, v in figures.items() if shown[0].fullmatch(k)}
        out += [f"Shown: {len(kept)} of {len(figures)} figures, {shown[1]}.", ""]
        figures = kept
    out += _tables(figures)
    if params:
        rows = [[f"`{k}`", _fmt(v)] for k, v in _flat(params, cap=CAP).items()]
        out += ["<details><summary>Parameters</summary>", "", *_table(["parameter", "value"], rows), "</details>", ""]  # fmt: skip
    return out


def _command(module: str, label: str, run: dict[str, Any]) -> str:
    params = _dict(run, "params")
    args: list[Any] = []
    if module == "onnx":
        args += ["--model", params.get("model", "fullsize"), "--threads", params.get("threads", 2)]
    elif module == "quality" and params.get("runs"):
        args += ["--backends", ",".join(params["runs"])]
    elif module == "tenancy" and params.get("sections"):
        args += ["--sections", ",".join(params["sections"])]
    elif module == "sweep" and "minilm_sweep_s" not in run.get("figures", {}):
        args.append("--skip-minilm")
    elif module == "soak":
        args += ["--minutes", f"{run.get('minutes', 60):g}", "--seed", run.get("seed", 7)]
        if label.startswith("citus-"):
            args += ["--citus-workers", label.removeprefix("citus-")]
    if params.get("quick") or run.get("quick") is True:
        args.append("--quick")
    return " ".join([f"python -m bench.{module}", *map(str, args)])


def _cpu(run: dict[str, Any]) -> str:
    machine = _dict(run, "machine")
    params = _dict(run, "params")
    cpus = machine.get("cpus") or params.get("cpus")
    return ", ".join([
        machine.get("cpu_model") or "CPU model not recorded",
        f"class {machine['cpu_class']}" if machine.get("cpu_class") else "CPU class not recorded",
        f"{cpus} CPUs" if cpus else "CPUs not recorded",
    ])  # fmt: skip


def _soak(label: str, run: dict[str, Any], images_dir: Path) -> list[str]:
    """A soak run: what must hold, what broke, the timeline; of the history only the
    answers per phase and the search latency."""
    out = [f"Stack: {_fmt(run['stack'])}.", ""] if isinstance(run.get("stack"), dict) else []
    out += ["What must hold:", "", *_tables(_flat(run["acceptance"]))]
    violations = run.get("violations") or []
    out += ["Violations:", "", *([f"- {_md(str(v))}" for v in violations] or ["None."]), ""]
    picture = Path(str(run.get("timeline") or f"docs/img/soak-{label}.png")).name
    if (images_dir / picture).is_file():
        out += [f"![The soak's timeline, {label}](img/{picture})", ""]
    history = _dict(run, "history")
    if isinstance(history.get("phases"), dict):
        out += ["Answers per phase:", "", *_tables(_flat(history["phases"], depth=2))]
    if isinstance(history.get("latency"), dict):
        out += ["Search latency per phase and per fault:", "", *_tables(_flat(history["latency"]))]
    return out


def _leaves(v: Any) -> int:
    if isinstance(v, dict):
        return sum(_leaves(x) for x in v.values())
    return sum(_leaves(x) for x in v) if isinstance(v, list) else 1


def _flat(d: dict[str, Any], depth: int = 99, cap: int | None = None) -> dict[str, Any]:
    """Nested dicts as dotted keys, `depth` levels at most; with `cap`, a value holding more
    values than that is a note instead."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if cap is not None and _leaves(v) > cap:
            out[str(k)] = f"({_leaves(v)} values: see the JSON file)"
        elif isinstance(v, dict) and v and depth > 1:
            out.update({f"{k}.{k2}": v2 for k2, v2 in _flat(v, depth - 1, cap).items()})
        else:
            out[str(k)] = v
    return out


def _records(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _tables(flat: dict[str, Any]) -> list[str]:
    """Undotted names as a name | value table; dotted ones as a grid (a row per name less its
    last part, a column per last part, turned when wider than long); lists of records each
    as a table."""
    plain = [[f"`{k}`", _fmt(v)] for k, v in flat.items() if "." not in k and not _records(v)]
    grid: dict[str, dict[str, Any]] = {}
    for k, v in flat.items():
        if "." in k and not _records(v):
            row, col = k.rsplit(".", 1)
            grid.setdefault(row, {})[col] = v
    out = _table(["figure", "value"], plain) if plain else []
    if grid:
        rows, cols = list(grid), list(dict.fromkeys(c for cells in grid.values() for c in cells))
        turned = len(cols) > len(rows)
        outer, inner = (cols, rows) if turned else (rows, cols)
        cell = (lambda o, i: grid[i].get(o)) if turned else (lambda o, i: grid[o].get(i))
        out += _table(["", *map(_md, inner)], [[f"`{o}`", *(_fmt(cell(o, i)) for i in inner)] for o in outer])
    for k, v in flat.items():
        if _records(v):
            cols = list(dict.fromkeys(c for record in v for c in record))
            out += [f"`{k}`:", "", *_table(list(map(_md, cols)), [[_fmt(r.get(c)) for c in cols] for r in v])]
    return out


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


def _fmt(v: Any) -> str:
    """A value for a table cell: floats to 3 significant digits (4 just below 1, whole from 1,000),
    thousands separated from 10,000."""
    if v is None or v == {} or v == []:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float) and abs(v) >= 10_000:
        return f"{v:,.0f}"
    if isinstance(v, float) and v == v:
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.{4 if 0.99 < abs(v) < 1 else 3}g}"
    if isinstance(v, dict):
        return ", ".join(f"{_md(str(k))}={_fmt(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ("; " if any(isinstance(x, dict) for x in v) else ", ").join(_fmt(x) for x in v)
    return _md(str(v))


def _md(text: str) -> str:
    """One line, `|`, `<` and `*` escaped outside code spans."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("|", r"\|").replace("<", "&lt;").replace("*", r"\*")
    return "`".join(parts)


def _slug(heading: str) -> str:
    """The anchor GitHub makes of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="docs/benchmarks.md from bench/results/*.json")
    p.add_argument("--write", action="store_true", help="write docs/benchmarks.md instead of printing it")
    args = p.parse_args(argv)
    page = render()
    if args.write:
        DOC.write_text(page, encoding="utf-8")
        print(f"-> {DOC.relative_to(ROOT)}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
