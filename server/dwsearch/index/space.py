"""An index's vector space: where its vectors come from and how they are compared.

A DocumentIndex is configured with one VectorSpace; nothing else about the index varies
with its type. The space names:
- the model column its rows are stored under (the embedding model's id, so the gRPC index
  and a REST index on the served model share its vectors; "upstash:{name}" for a REST index
  whose vectors come with the requests);
- its dense encoder: the EmbedderService, or none (vectors come with each request, of a
  fixed dimension; a SPARSE index stores PLACEHOLDER_DENSE, never read);
- its sparse encoder: the embedding model's own sparse output, BM25 (dwsearch.retrieval.bm25,
  computed here), or none;
- its metric, for a space whose scores are reported the Upstash way (None: the gRPC
  index's inner product of unit vectors, scores as the store computes them).

A fixed space (vectors given with the requests) stores them as sent, in float32
(`vector32`), and the store compares them by the metric itself (pgvector's cosine, inner
product and L2 operators): the store's similarity is the cosine, the inner product or
-|q - x|². Scores as Upstash reports them, within [0, 1], an identical vector's exactly 1
on every metric (VectorSpace.score says how):
- COSINE: (1 + cos) / 2;
- DOT_PRODUCT: (1 + dot) / 2;
- EUCLIDEAN: 1 / (1 + |q - x|²).
A space over the embedder's model keeps halfvec and inner product (the embedder's vectors
are unit length); a metric there maps given vectors so that inner product ranks as it
does: COSINE the unit vector; EUCLIDEAN x stored with |x|² appended and q sent as
(2q, -1), so the inner product is |q|² - |q - x|².
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dwsearch.common.errors import InvalidArgument
from dwsearch.index.documents import FLOAT32_MAX, HALFVEC_MAX, DenseValues

FLOAT32_UNIT_ROUNDOFF = 2.0**-24
"""u: a float32 operation's result is within a factor (1 ± u) of the exact one."""
FLOAT32_MIN_NORMAL = float(np.finfo(np.float32).tiny)

PLACEHOLDER_DENSE = (0.0,)
"""A space without dense vectors still fills the dense column (NOT NULL): one zero."""
SPARSE_DIMENSION = 1_000_000_000
"""pgvector's largest sparsevec dimension: a fixed space's sparse indices are 0..999,999,999."""


class Metric(enum.Enum):
    COSINE = "COSINE"
    DOT_PRODUCT = "DOT_PRODUCT"
    EUCLIDEAN = "EUCLIDEAN"


class SparseEncoder(enum.Enum):
    NONE = "none"  # no sparse vectors
    MODEL = "model"  # the embedding model's own sparse output (bge-m3's lexical weights)
    GIVEN = "given"  # sparse vectors come with the requests (a fixed space's, 0..SPARSE_DIMENSION-1)
    BM25 = "bm25"  # dwsearch.retrieval.bm25, computed here (given vectors are in its term space)


@dataclass(frozen=True)
class VectorSpace:
    model: str
    """The model column of the space's rows."""
    dense_from_embedder: bool = True
    """False: dense vectors come with each request (a fixed space of `dimension`)."""
    sparse: SparseEncoder = SparseEncoder.MODEL
    dimension: int = 0
    """A fixed space's dimension as requests give it (0: the embedding model's)."""
    has_dense: bool = True
    """False: a sparse-only space (rows hold PLACEHOLDER_DENSE)."""
    metric: Metric | None = None

    @property
    def embeds_text(self) -> bool:
        """Whether a document's or a query's text can be turned into vectors here."""
        return self.dense_from_embedder or self.sparse is SparseEncoder.BM25

    @property
    def needs_embedder(self) -> bool:
        return self.dense_from_embedder

    @property
    def fixed(self) -> bool:
        """Its dimensions are its own, not an embedding model's."""
        return not self.dense_from_embedder

    @property
    def float32(self) -> bool:
        """Dense vectors kept in float32 (`vector32`: as sent, or as the embedder made them)
        and compared by the metric: every space with a metric (the REST API's)."""
        return self.has_dense and self.metric is not None

    @property
    def stored_dimension(self) -> int:
        """A fixed space's dense dimension as stored: a sparse-only space stores
        PLACEHOLDER_DENSE; EUCLIDEAN over halfvec appends |x|²."""
        if not self.has_dense:
            return len(PLACEHOLDER_DENSE)
        return self.dimension + (self.metric is Metric.EUCLIDEAN and not self.float32)

    def stored(self, vector: DenseValues, where: str) -> DenseValues:
        """A document's dense vector as the store keeps it (a sparse-only space's
        PLACEHOLDER_DENSE as it is). A float64 array (a REST upsert's) stays one, the very
        array where the space keeps vectors as sent."""
        if not self.has_dense:
            return [float(v) for v in vector]
        values = self._normalized(vector, where, query=False)
        if self.metric is Metric.EUCLIDEAN and not self.float32:
            return [*values, _squared_norm(values, where)]
        return values

    def query(self, vector: Sequence[float], where: str) -> tuple[list[float], float]:
        """A query's dense vector as sent to the store, and |q|² (EUCLIDEAN over halfvec:
        its score needs it)."""
        normalized = self._normalized(vector, where, query=True)
        values = normalized.tolist() if isinstance(normalized, np.ndarray) else list(normalized)
        if self.metric is Metric.EUCLIDEAN and not self.float32:
            return [*(2 * v for v in values), -1.0], _squared_norm(values, where)
        return values, 0.0

    def external(self, stored: list[float]) -> list[float]:
        """A stored dense vector as the space's clients know it."""
        return stored[:-1] if self.metric is Metric.EUCLIDEAN and not self.float32 else stored

    def score(self, similarity: float, query_squared_norm: float, dimension: int = 0) -> float:
        """A dense match's score from the store's similarity (the inner product; in a
        float32 space the cosine, the inner product or -|q - x|²): as it is without a
        metric, else the metric's normalised score within [0, 1], as Upstash's.

        A vector queried against itself scores exactly 1 on every metric, as Upstash's
        does, and every score is a non-decreasing function of the similarity, so the hits
        keep the store's order:
        - COSINE: the query reaches the store as sent (`query`), the very float32 values a
          stored copy holds, so pgvector sums the same products for the dot product and
          both squared lengths, and s / sqrt(s * s) is exactly 1 in double precision (a
          float32 squared is exact, and so is its root). Sent at unit length, another
          array, it scored 0.99999994 about half the time. Nothing is rounded here.
        - EUCLIDEAN: |q - x|² is exactly 0.
        - DOT_PRODUCT: nothing divides by the lengths. A unit vector sent in decimal,
          rounded to float32 (each value within a factor 1 ± u) and its squares summed in
          float32 in any order, has an inner product with itself within
          γ(n + 2) = (n + 2)u / (1 - (n + 2)u) of 1 for n = `dimension` (Higham, Accuracy
          and Stability of Numerical Algorithms, 3.1; pgvector 0.8's was within 3 units of
          2^-24 at 384 dimensions, 6 at 3,072). An inner product that close below 1 is 1
          at the store's precision and scores 1, as one above 1 does; below the bound a
          score is as computed.
        """
        if self.metric is None:
            return similarity
        if self.metric is Metric.EUCLIDEAN:
            distance = -similarity if self.float32 else query_squared_norm - similarity
            return 1.0 / (1.0 + max(0.0, distance))
        if self.metric is Metric.DOT_PRODUCT and similarity >= 1.0 - _self_product_error(dimension):
            return 1.0
        return min(1.0, max(0.0, (1.0 + similarity) / 2.0))

    def _normalized(self, vector: DenseValues, where: str, *, query: bool) -> DenseValues:
        # A float64 array's squares, sums and quotients are the very ones of its floats.
        array = isinstance(vector, np.ndarray) and vector.dtype == np.float64
        if self.metric is not Metric.COSINE:
            return vector if array else [float(v) for v in vector]
        squares = np.square(vector).tolist() if array else (float(v) * float(v) for v in vector)
        norm = math.sqrt(math.fsum(squares))
        if not math.isfinite(norm):
            raise InvalidArgument(f"{where}: not finite (NaN or infinity)")
        if norm == 0:
            raise InvalidArgument(f"{where}: a zero vector has no cosine similarity")
        if self.float32 and not query:
            # Kept as sent; the store's cosine normalises, summing the squares in float32.
            if norm * norm > FLOAT32_MAX:
                raise InvalidArgument(
                    f"{where}: its squared length is beyond {FLOAT32_MAX:g}, the most a float32 cosine can"
                    " compare (a cosine ignores the scale: divide the vector by its length)"
                )
            return vector if array else [float(v) for v in vector]
        if self.float32 and FLOAT32_MIN_NORMAL <= norm * norm <= FLOAT32_MAX:
            # As sent: a stored copy of it is the same float32 array, whose cosine with it
            # the store computes as exactly 1 (score). Its scale changes no cosine.
            return vector if array else [float(v) for v in vector]
        # Sent at unit length: a scale whose squares float32 cannot sum (overflowing, or
        # below its normal numbers) changes no cosine either.
        return np.divide(vector, norm) if array else [float(v) / norm for v in vector]


def _self_product_error(dimension: int) -> float:
    """γ(n + 2): how far from 1 the store's float32 inner product of a unit vector of
    `dimension` values with itself may be (VectorSpace.score); 0 for an unknown dimension."""
    if dimension <= 0:
        return 0.0
    terms = (dimension + 2) * FLOAT32_UNIT_ROUNDOFF
    return terms / (1.0 - terms)


def _squared_norm(vector: DenseValues, where: str) -> float:
    squared = math.fsum(v * v for v in vector)
    if not squared <= HALFVEC_MAX:
        raise InvalidArgument(f"{where}: |v|² is over {HALFVEC_MAX:g}, the most a EUCLIDEAN index stores")
    return squared
