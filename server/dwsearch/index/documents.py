"""The index's plain data types and the checks every request passes before any work is
done (so a bad request changes nothing) — no I/O here."""

from __future__ import annotations

import base64
import binascii
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dwsearch.common.errors import FailedPrecondition, InvalidArgument
from dwsearch.retrieval.fusion import Fusion, LegScore

__all__ = ["Fusion"]  # the index's fusion methods: Fusion.RRF and Fusion.DBSF

SCOPED_NAMESPACE_SEPARATOR = "\x1f"
"""A namespace holding it belongs to an index of the REST API (dwsearch.rest: `{index}` +
separator + `{namespace}`); IndexService.Info leaves such namespaces out."""
MAX_ID_BYTES = 512
MAX_NAMESPACE_BYTES = 512
MAX_CURSOR_BYTES = 1024
"""A Range cursor: an id of at most MAX_ID_BYTES, base64-encoded."""
MAX_BATCH = 1000
"""Documents per Upsert, ids per Fetch and per Delete."""
MAX_DATA_BYTES = 128 * 1024
"""A document's text. The embedder truncates to the model's input limit (8192 tokens
for bge-m3); the stored text is whole."""
MAX_QUERY_BYTES = 32 * 1024
"""A query text or an agent-context message."""
MAX_KNOWN_NAMES = 1000
MAX_NAME_BYTES = 256
"""Names to redact, per request: each becomes a branch of one regex."""
DEFAULT_TOP_K = 10
MAX_TOP_K = 1000
DEFAULT_RANGE_LIMIT = 100
MAX_RANGE_LIMIT = 1000

HALFVEC_MAX = 65504.0
"""Largest finite float16: the range of a stored dense vector's components."""
SPARSEVEC_MAX_NNZ = 16000
"""pgvector's limit on non-zero entries in one sparsevec."""
FLOAT32_MAX = float(np.finfo(np.float32).max)
"""sparsevec values are float32."""


class QueryMode(enum.Enum):
    DENSE = "dense"
    SPARSE = "sparse"
    HYBRID = "hybrid"


class Weighting(enum.Enum):
    """How a query's sparse values are weighted before the search."""

    IDF = "idf"  # each value times its term's inverse document frequency in the namespace


class MetadataMode(enum.Enum):
    PATCH = "patch"
    OVERWRITE = "overwrite"


@dataclass(frozen=True)
class Include:
    """Which fields reads return besides the id (and the score)."""

    data: bool = False
    metadata: bool = False
    vectors: bool = False


DenseValues = Sequence[float] | np.ndarray
"""A dense vector as given: a list of numbers, or a 1-D float64 array (a REST upsert's
vectors, parsed so by dwsearch.rest.jsonbody: the same doubles)."""


@dataclass(frozen=True)
class Document:
    """A document to upsert: text to embed, or a dense vector (and optionally a sparse
    one) stored as given, with any text stored beside it."""

    id: str
    data: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    vector: DenseValues | None = None
    sparse_vector: Mapping[int, float] | None = None


@dataclass(frozen=True)
class StoredDocument:
    """A document as read back; fields not asked for are None."""

    id: str
    data: str | None = None
    metadata: dict[str, Any] | None = None
    vector: list[float] | None = None
    sparse_vector: dict[int, float] | None = None


@dataclass(frozen=True)
class HitExplanation:
    """How a hit was ranked: every source that found it (the retrieval core's LegScore: the
    source, the hit's 1-based rank in it, the source's own score, its term before the
    weight — RRF: 1 / (60 + rank - 1); DBSF: the score normalised over the source's
    candidates; a single source: the score itself — and the weight); fused_score, the sum of
    weight × normalized over them, is the hit's score (a single DENSE source: before the
    metric's mapping, which keeps the order)."""

    legs: tuple[LegScore, ...]
    fused_score: float


@dataclass(frozen=True)
class Hit:
    """A query result; score is higher-is-better (see Query)."""

    document: StoredDocument
    score: float
    explanation: HitExplanation | None = None


@dataclass(frozen=True)
class Query:
    """Nearest documents to `data` (redacted, then embedded as a query) or to the given
    vectors. `mode` None: HYBRID when both a dense and a sparse query vector exist, else
    whichever one does. Scores: inner product for DENSE and SPARSE, the fused score for
    HYBRID."""

    namespace: str = ""
    data: str | None = None
    vector: Sequence[float] | None = None
    sparse_vector: Mapping[int, float] | None = None
    top_k: int = 0
    filter: str = ""
    mode: QueryMode | None = None
    fusion: Fusion = Fusion.RRF
    include: Include = Include()
    weighting: Weighting | None = None
    """IDF: the sparse query's values weighted by their terms' document frequencies (a
    BM25 space's text queries always are)."""
    similar_to: str | None = None
    """A stored document's id: its own vectors (dense and sparse, not re-embedded) are the
    query, and the document itself is left out of the hits (NOT_FOUND if absent)."""
    explain: bool = False
    """Each hit's explanation (HitExplanation)."""


@dataclass(frozen=True)
class RangePage:
    documents: list[StoredDocument]
    next_cursor: str  # "" when there is nothing more


@dataclass(frozen=True)
class IndexInfo:
    model: str
    dimension: int
    sparse_supported: bool
    namespaces: dict[str, int]  # document count per namespace, active model only

    @property
    def document_count(self) -> int:
        return sum(self.namespaces.values())


# --- Checks ------------------------------------------------------------------------


def check_text(value: str, where: str, *, max_bytes: int) -> None:
    if "\x00" in value:  # Postgres text cannot hold NUL
        raise InvalidArgument(f"{where}: NUL character")
    size = len(value.encode())
    if size > max_bytes:
        raise InvalidArgument(f"{where}: {size} bytes; the limit is {max_bytes}")


def check_namespace(namespace: str) -> None:
    check_text(namespace, "namespace", max_bytes=MAX_NAMESPACE_BYTES)


def check_id(doc_id: str, where: str = "id") -> None:
    if not doc_id:
        raise InvalidArgument(f"{where}: empty")
    check_text(doc_id, where, max_bytes=MAX_ID_BYTES)


def check_ids(ids: Sequence[str], where: str = "ids") -> None:
    check_count(len(ids), where, MAX_BATCH)
    for i, doc_id in enumerate(ids):
        check_id(doc_id, f"{where}[{i}]")


def check_known_names(names: Sequence[str]) -> None:
    if len(names) > MAX_KNOWN_NAMES:
        raise InvalidArgument(f"known_names: {len(names)} given; at most {MAX_KNOWN_NAMES}")
    for i, name in enumerate(names):
        check_text(name, f"known_names[{i}]", max_bytes=MAX_NAME_BYTES)


def check_count(count: int, where: str, maximum: int) -> None:
    if not 1 <= count <= maximum:
        raise InvalidArgument(f"{where}: {count} given; 1 to {maximum} allowed")


def check_query_text(text: str, where: str) -> None:
    if not text.strip():
        raise InvalidArgument(f"{where}: empty")
    check_text(text, where, max_bytes=MAX_QUERY_BYTES)


def effective_top_k(top_k: int) -> int:
    if not 0 <= top_k <= MAX_TOP_K:
        raise InvalidArgument(f"top_k: {top_k}; 1 to {MAX_TOP_K} allowed (0 means {DEFAULT_TOP_K})")
    return top_k or DEFAULT_TOP_K


def effective_range_limit(limit: int) -> int:
    if not 0 <= limit <= MAX_RANGE_LIMIT:
        raise InvalidArgument(
            f"limit: {limit}; 1 to {MAX_RANGE_LIMIT} allowed (0 means {DEFAULT_RANGE_LIMIT})"
        )
    return limit or DEFAULT_RANGE_LIMIT


def dense_vector(
    values: DenseValues, dimension: int | None, where: str, *, float32: bool = False
) -> np.ndarray:
    """values as float32, checked: the model's dimension (None: not yet known, check the
    rest), finite, within the range of the column they are stored in (half precision, or
    `float32`: a space that keeps its vectors in float32)."""
    vector = np.asarray(values, dtype=np.float64)
    if vector.ndim != 1 or (dimension is not None and vector.shape != (dimension,)):
        raise InvalidArgument(f"{where}: {len(values)} dimensions; the model has {dimension}")
    if not np.isfinite(vector).all():
        raise InvalidArgument(f"{where}: not finite (NaN or infinity)")
    limit, kind = (FLOAT32_MAX, "float32") if float32 else (HALFVEC_MAX, "half-precision")
    if np.abs(vector).max(initial=0.0) > limit:
        raise InvalidArgument(
            f"{where}: a component is beyond ±{limit:g}, the range of a stored {kind} vector"
        )
    return vector.astype(np.float32)


def sparse_vector(weights: Mapping[int, float], dimension: int, where: str) -> dict[int, float]:
    """weights checked against the model's sparse dimension (0: the model has none)."""
    if dimension == 0:
        raise FailedPrecondition(f"{where}: the model has no sparse vectors")
    if len(weights) > SPARSEVEC_MAX_NNZ:
        raise InvalidArgument(f"{where}: {len(weights)} entries; the limit is {SPARSEVEC_MAX_NNZ}")
    for index, value in weights.items():
        if not 0 <= index < dimension:
            raise InvalidArgument(f"{where}: index {index} outside 0..{dimension - 1}")
        if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
            raise InvalidArgument(f"{where}: value at index {index} is not a finite float")
    return dict(weights)


def resolve_mode(requested: QueryMode | None, *, dense: bool, sparse: bool) -> QueryMode:
    """The mode a query runs in, given which query vectors exist."""
    if requested is None:
        if dense and sparse:
            return QueryMode.HYBRID
        return QueryMode.DENSE if dense else QueryMode.SPARSE
    if requested is not QueryMode.SPARSE and not dense:
        raise InvalidArgument(f"mode {requested.value}: needs a dense query vector (vector or data)")
    if requested is not QueryMode.DENSE and not sparse:
        raise InvalidArgument(f"mode {requested.value}: needs a sparse query vector (sparse_vector or data)")
    return requested


# --- Range cursors and id prefixes -------------------------------------------------


def encode_cursor(last_id: str) -> str:
    """Opaque to clients: the last id a page returned."""
    return base64.urlsafe_b64encode(last_id.encode()).decode()


def decode_cursor(cursor: str) -> str:
    check_text(cursor, "cursor", max_bytes=MAX_CURSOR_BYTES)
    try:
        last_id = base64.urlsafe_b64decode(cursor.encode("ascii")).decode()
    except (UnicodeError, binascii.Error, ValueError):
        raise InvalidArgument("cursor: not a cursor Range returned") from None
    if not last_id or "\x00" in last_id:
        raise InvalidArgument("cursor: not a cursor Range returned")
    return last_id


MAX_PLACE = 2**63 - 1
"""A place in a namespace's insertion order is a bigint (dw_index_documents.seq)."""


def encode_place_cursor(place: int) -> str:
    """A REST index's Range cursor: the place of the next record in its namespace's
    insertion order (store.take_places), in decimal, as Upstash's: "5" after the first five
    records of a new namespace."""
    return str(place)


def decode_place_cursor(cursor: str) -> int:
    """The place a REST index's page starts at: a decimal cursor (encode_place_cursor), or
    one of the form these indexes gave before, the last place returned, encode_cursor'd
    (never all digits: base64 of a digit starts with M, N or O)."""
    check_text(cursor, "cursor", max_bytes=MAX_CURSOR_BYTES)
    if cursor.isascii() and cursor.isdigit():
        place = int(cursor)
    else:
        last = decode_cursor(cursor)
        if not (last.isascii() and last.isdigit()):
            raise InvalidArgument("cursor: not one this index gave")
        place = int(last) + 1
    if place > MAX_PLACE:
        raise InvalidArgument("cursor: not one this index gave")
    return place


_SURROGATES = range(0xD800, 0xE000)


def prefix_upper_bound(prefix: str) -> str | None:
    """The least string greater than every string that starts with prefix, in code-point
    order (the id column's "C" collation on UTF-8), so `prefix <= id < bound` is exactly
    "id starts with prefix" and a key range. None: no bound (prefix is all U+10FFFF)."""
    stem = prefix
    while stem:
        following = ord(stem[-1]) + 1
        if following in _SURROGATES:  # not encodable in UTF-8; nothing sorts between
            following = _SURROGATES.stop
        if following <= 0x10FFFF:
            return stem[:-1] + chr(following)
        stem = stem[:-1]
    return None
