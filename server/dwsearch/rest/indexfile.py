"""The REST API's indexes: a TOML file (DWSEARCH_REST_INDEXES) with one [[index]] table each.

[[index]]
name = "support"          # served at /support/… and at /… for this index's token
token = "…"               # or a list: several tokens, for rotation
dimension = 1024
metric = "COSINE"         # COSINE | EUCLIDEAN | DOT_PRODUCT
type = "DENSE"            # DENSE | SPARSE | HYBRID
dense_model = "default"   # optional: *-data embedded by the EmbedderService ("default": the
                          # served model, DWSEARCH_EMBED_MODEL); dimension then optional
sparse_model = "BM25"     # optional, SPARSE / HYBRID: BM25 (dwsearch.retrieval.bm25), or "default"
                          # (the served model's own sparse output, e.g. bge-m3's)
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from dwsearch.common.errors import StartupError

METRICS = ("COSINE", "DOT_PRODUCT", "EUCLIDEAN")
TYPES = ("DENSE", "SPARSE", "HYBRID")
MAX_DIMENSION = 15999  # pgvector's halfvec limit (16,000), less EUCLIDEAN's extra component
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
RESERVED = frozenset({
    "upsert", "upsert-data", "query", "query-data", "fetch", "range", "delete", "update", "reset", "info",
    "list-namespaces", "delete-namespace", "resumable-query", "resumable-query-data", "resumable-query-next",
    "resumable-query-end",
})  # fmt: skip
"""Index names that would shadow an endpoint at /…."""


@dataclass(frozen=True)
class RestIndexConfig:
    name: str
    tokens: tuple[str, ...]
    dimension: int
    metric: str = "COSINE"
    type: str = "DENSE"
    dense_model: str = ""
    sparse_model: str = ""


def parse_indexes(text: str, where: str = "DWSEARCH_REST_INDEXES") -> list[RestIndexConfig]:
    """The [[index]] tables; StartupError naming the file and the table for anything wrong."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise StartupError(f"{where}: not TOML: {e}") from None
    tables = document.get("index")
    if not isinstance(tables, list) or not tables:
        raise StartupError(f"{where}: no [[index]] tables")
    indexes: list[RestIndexConfig] = []
    seen_tokens: dict[str, str] = {}
    for i, table in enumerate(tables):
        at = f"{where}: index[{i}]"
        unknown = set(table) - {"name", "token", "dimension", "metric", "type", "dense_model", "sparse_model"}
        if unknown:
            raise StartupError(f"{at}: unknown keys {sorted(unknown)}")
        name = table.get("name")
        if not isinstance(name, str) or not NAME.match(name) or name in RESERVED:
            raise StartupError(f"{at}: name {name!r}: letters, digits, _ and -, not an endpoint's name")
        if any(index.name == name for index in indexes):
            raise StartupError(f"{at}: name {name!r} given twice")
        tokens = table.get("token")
        tokens = [tokens] if isinstance(tokens, str) else tokens
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
            raise StartupError(f"{at} ({name}): token: a non-empty string or a list of them")
        for token in tokens:
            if token in seen_tokens:
                raise StartupError(f"{at} ({name}): a token of index {seen_tokens[token]!r} too")
            seen_tokens[token] = name
        metric = str(table.get("metric", "COSINE")).upper()
        if metric not in METRICS:
            raise StartupError(f"{at} ({name}): metric {metric!r}; supported: {', '.join(METRICS)}")
        kind = str(table.get("type", "DENSE")).upper()
        if kind not in TYPES:
            raise StartupError(f"{at} ({name}): type {kind!r}; supported: {', '.join(TYPES)}")
        dense_model, sparse_model = table.get("dense_model", ""), table.get("sparse_model", "")
        if not isinstance(dense_model, str) or not isinstance(sparse_model, str):
            raise StartupError(f"{at} ({name}): dense_model, sparse_model: strings")
        if sparse_model.upper() == "BM25":
            sparse_model = "BM25"
        if kind == "DENSE" and sparse_model:
            raise StartupError(f"{at} ({name}): a DENSE index has no sparse_model")
        if kind == "HYBRID" and bool(dense_model) != bool(sparse_model):
            raise StartupError(
                f"{at} ({name}): a HYBRID index embeds data with both dense_model and sparse_model, or neither"
            )
        if dense_model and metric == "EUCLIDEAN":
            raise StartupError(
                f"{at} ({name}): a dense_model's unit vectors rank the same by COSINE; use COSINE"
            )
        if kind == "SPARSE" and (dense_model or "dimension" in table):
            raise StartupError(f"{at} ({name}): a SPARSE index has no dense dimension or dense_model")
        dimension = table.get("dimension", 0 if dense_model or kind == "SPARSE" else None)
        if (
            not isinstance(dimension, int)
            or isinstance(dimension, bool)
            or not (1 <= dimension <= MAX_DIMENSION or ((dense_model or kind == "SPARSE") and dimension == 0))
        ):
            raise StartupError(f"{at} ({name}): dimension: an integer from 1 to {MAX_DIMENSION}")
        indexes.append(
            RestIndexConfig(name, tuple(tokens), dimension, metric, kind, dense_model, sparse_model)
        )
    return indexes


def load_indexes(path: str) -> list[RestIndexConfig]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise StartupError(f"DWSEARCH_REST_INDEXES: cannot read {path}: {e.strerror}") from None
    return parse_indexes(text, f"DWSEARCH_REST_INDEXES ({path})")
