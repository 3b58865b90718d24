"""The quantization guard: an int8 export is compared with its float32 graph on the shipped
probe set (dwsearch.modelserver.probeset) when it is made, on the CPU it is made on, and is
never served unless it passes. What each backend feeds and reads is its own
(ExportSpec.probe); the figures and thresholds are here.

- embedders: each probe's dense vector (normalized) against float32's, by cosine: mean
  ≥ 0.99, none below 0.97 (a saturated AVX2 sum measured 0.947 on the tiny test model,
  where exact int8 keeps 0.999); with sparse output, each probe's top terms the same;
- rerankers: each probe's documents in the same order. Documents whose float32 logits are
  within RERANK_TIE of each other are a tie, either order counting as the same: a
  cross-encoder's logits lie a few units either side of zero, 0.1 apart is a sigmoid
  difference under 2.5 points (equally relevant), and exact int8 moves a logit by
  0.03-0.06 on the test models, where a saturated AVX2 sum moved it by 0.16.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DENSE_COSINE_MEAN = 0.99
DENSE_COSINE_MIN = 0.97
# A probe's top sparse terms: its TOP_TERMS heaviest in float32 must be among int8's
# TOP_TERMS heaviest, except terms within TERM_TIE (relative) of the first weight left out,
# which either graph may put on either side. Exact int8 moves a full-size bge-m3's lexical
# weight by about 0.03 (13 % relative, median; its weights around 0.24): its three
# heaviest terms stay the three heaviest, up to such ties, on every probe, while its
# fourth and fifth trade places on 6 of 76 (measured with random weights: bench.onnx).
TOP_TERMS = 3
TERM_TIE = 0.1
# Share of probes that must keep their top terms. Not all: at full size (bench.onnx, random
# weights, lexical weights clustered around 0.24) exact 8-bit int8 keeps 76 of 76 and 7-bit
# 73 of 76 (dense cosine min 0.996), where one term at the boundary trades places; a
# saturated sum breaks the dense vectors far below their thresholds first (min 0.947).
SPARSE_TOP_TERMS_SAME = 0.95
RERANK_TIE = 0.1
RERANK_ORDER_SAME = 1.0


@dataclass(frozen=True)
class EmbeddingProbes:
    """What an embedder's graph gave for each probe text."""

    dense: list[np.ndarray]  # normalized
    sparse: list[dict[int, float]] | None = None  # lexical weights, when the model has them


@dataclass(frozen=True)
class RerankProbes:
    """What a reranker's graph gave for each probe: one logit per document."""

    logits: list[np.ndarray]


Probed = EmbeddingProbes | RerankProbes


@dataclass(frozen=True)
class QuantizationCheck:
    passed: bool
    cpu_class: str
    probes: int
    dense_cosine_mean: float = 0.0
    dense_cosine_min: float = 0.0
    sparse_top_terms_same: float = 0.0
    rerank_order_same: float = 0.0
    rerank_logit_max_diff: float = 0.0
    failure: str = ""
    kind: str = "embedder"  # "embedder" | "reranker": which figures apply

    def to_manifest(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any] | None) -> QuantizationCheck | None:
        if not isinstance(entry, Mapping):
            return None
        try:
            return cls(
                passed=bool(entry["passed"]),
                cpu_class=str(entry.get("cpu_class", "")),
                probes=int(entry.get("probes", 0)),
                dense_cosine_mean=float(entry.get("dense_cosine_mean", 0.0)),
                dense_cosine_min=float(entry.get("dense_cosine_min", 0.0)),
                sparse_top_terms_same=float(entry.get("sparse_top_terms_same", 0.0)),
                rerank_order_same=float(entry.get("rerank_order_same", 0.0)),
                rerank_logit_max_diff=float(entry.get("rerank_logit_max_diff", 0.0)),
                failure=str(entry.get("failure", "")),
                kind=str(entry.get("kind", "embedder")),
            )
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def from_pb(cls, message: Any, kind: str = "embedder") -> QuantizationCheck:
        """From a QuantizationCheck message (Info's runtime_report)."""
        return cls(
            passed=message.passed,
            cpu_class=message.cpu_class,
            probes=message.probes,
            dense_cosine_mean=message.dense_cosine_mean,
            dense_cosine_min=message.dense_cosine_min,
            sparse_top_terms_same=message.sparse_top_terms_same,
            rerank_order_same=message.rerank_order_same,
            rerank_logit_max_diff=message.rerank_logit_max_diff,
            failure=message.failure,
            kind=kind,
        )

    def summary(self) -> str:
        """The figures in one line, for logs and notes."""
        if self.kind == "reranker":
            figures = (
                f"rerank order same {self.rerank_order_same:.3f}, "
                f"logit max diff {self.rerank_logit_max_diff:.4f}"
            )
        else:
            figures = f"dense cosine mean {self.dense_cosine_mean:.4f} min {self.dense_cosine_min:.4f}"
            if self.sparse_top_terms_same:
                figures += f", sparse top terms same {self.sparse_top_terms_same:.3f}"
        return f"{figures} over {self.probes} probes on {self.cpu_class}"


def compare(reference: Probed, quantized: Probed, *, cpu_class: str) -> QuantizationCheck:
    """The check of `quantized` (the int8 graph's outputs) against `reference` (float32's)."""
    if isinstance(reference, EmbeddingProbes) and isinstance(quantized, EmbeddingProbes):
        return _compare_embeddings(reference, quantized, cpu_class)
    if isinstance(reference, RerankProbes) and isinstance(quantized, RerankProbes):
        return _compare_reranks(reference, quantized, cpu_class)
    raise TypeError("the two graphs' probes are of different kinds")


def _compare_embeddings(
    reference: EmbeddingProbes, quantized: EmbeddingProbes, cpu_class: str
) -> QuantizationCheck:
    cosines = [cosine(a, b) for a, b in zip(reference.dense, quantized.dense, strict=True)]
    mean, low = float(np.mean(cosines)), float(np.min(cosines))
    failures = []
    if mean < DENSE_COSINE_MEAN:
        failures.append(f"dense cosine mean {mean:.4f} < {DENSE_COSINE_MEAN}")
    if low < DENSE_COSINE_MIN:
        failures.append(f"dense cosine min {low:.4f} < {DENSE_COSINE_MIN}")
    terms = 0.0
    if reference.sparse is not None and quantized.sparse is not None:
        same = [same_top_terms(a, b) for a, b in zip(reference.sparse, quantized.sparse, strict=True)]
        terms = sum(same) / len(same)
        if terms < SPARSE_TOP_TERMS_SAME:
            failures.append(f"sparse top terms differ on {len(same) - sum(same)} of {len(same)} probes")
    return QuantizationCheck(
        passed=not failures,
        cpu_class=cpu_class,
        probes=len(cosines),
        dense_cosine_mean=round(mean, 6),
        dense_cosine_min=round(low, 6),
        sparse_top_terms_same=round(terms, 6),
        failure="; ".join(failures),
    )


def _compare_reranks(reference: RerankProbes, quantized: RerankProbes, cpu_class: str) -> QuantizationCheck:
    same = [same_order(a, b) for a, b in zip(reference.logits, quantized.logits, strict=True)]
    share = sum(same) / len(same)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(reference.logits, quantized.logits, strict=True))
    failure = ""
    if share < RERANK_ORDER_SAME:
        failure = f"documents reordered on {len(same) - sum(same)} of {len(same)} probes (logit max diff {diff:.4f})"
    return QuantizationCheck(
        passed=not failure,
        cpu_class=cpu_class,
        probes=sum(len(logits) for logits in reference.logits),
        rerank_order_same=round(share, 6),
        rerank_logit_max_diff=round(diff, 6),
        failure=failure,
        kind="reranker",
    )


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norms if norms > 0 else 0.0


def same_top_terms(
    reference: Mapping[int, float], quantized: Mapping[int, float], k: int = TOP_TERMS
) -> bool:
    """Whether the terms clearly in `reference`'s top `k` are in `quantized`'s top `k`."""
    ranked = sorted(reference, key=lambda term: (-reference[term], term))
    if not ranked:
        return not quantized
    k = min(k, len(ranked))
    left_out = reference[ranked[k]] if len(ranked) > k else 0.0
    clear = [term for term in ranked[:k] if reference[term] > left_out * (1 + TERM_TIE)]
    top = set(sorted(quantized, key=lambda term: (-quantized[term], term))[:k])
    return all(term in top for term in clear)


def same_order(reference: np.ndarray, quantized: np.ndarray, tie: float = RERANK_TIE) -> bool:
    """Whether every pair of documents whose float32 logits differ by more than `tie`
    keeps its order."""
    for i in range(len(reference)):
        for j in range(i + 1, len(reference)):
            gap = float(reference[i] - reference[j])
            if abs(gap) > tie and gap * float(quantized[i] - quantized[j]) <= 0:
                return False
    return True


def embedding_probes(dense: np.ndarray, sparse: Sequence[dict[int, float]] | None = None) -> EmbeddingProbes:
    """Rows of `dense`, normalized, with their lexical weights."""
    norms = np.maximum(np.linalg.norm(dense, axis=-1, keepdims=True), 1e-12)
    rows = list((dense / norms).astype(np.float32))
    return EmbeddingProbes(rows, list(sparse) if sparse is not None else None)


@dataclass(frozen=True)
class RuntimeReport:
    """How a model server computes: what Info, the start-up log and the metrics say."""

    cpu_class: str
    quantization: str  # "none" | "int8" | "int8-7bit" | "q4" (a backend's own 4-bit weights)
    check: QuantizationCheck | None = None
    note: str = ""  # why it runs what it runs, when that is not what was configured

    def to_pb(self) -> Any:
        from dwsearch.v1 import embedder_pb2

        report = embedder_pb2.ModelRuntimeReport(
            cpu_class=self.cpu_class, quantization=self.quantization, note=self.note
        )
        if self.check is not None:
            check = self.check.to_manifest()
            del check["kind"]
            report.quantization_check.CopyFrom(embedder_pb2.QuantizationCheck(**check))
        return report

    def log_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"cpu_class": self.cpu_class, "quantization": self.quantization}
        if self.check is not None:
            fields["quantization_check"] = self.check.summary()
            fields["quantization_check_passed"] = self.check.passed
        if self.note:
            fields["runtime_note"] = self.note
        return fields


def default_report(quantization: str = "none", note: str = "") -> RuntimeReport:
    """A backend that runs its own engine: this CPU's class and the quantization its
    weights came with ("none": the dtype Info reports; no dwsearch export or check)."""
    from dwsearch.modelserver import cpuclass

    return RuntimeReport(cpuclass.detect(), quantization, note=note)
