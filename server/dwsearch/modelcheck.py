"""`dwsearch model-check`: the rollout check an SRE runs against the deployed embedder (and
reranker) before an environment's semantic-search flag goes on.

It reads each service's Info (model, runtime and the int8 export's check against float32),
embeds the shipped probe set (dwsearch.modelserver.probeset) through the deployed embedder and
measures cross-lingual recall: each topic's message in one language as the query, ranked
by cosine against every topic's message in another; with a reranker, each probe's relevant
document must come first. It prints one table and exits EXIT_OK, EXIT_FAILED or
EXIT_UNREACHABLE.

The scoring and the table are plain functions over plain data (`ranks`, `recall`,
`*_checks`, `table`); `collect` is the one part that talks gRPC.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from dwsearch.clients.channel import auth_metadata, open_channel
from dwsearch.clients.embedder import SERVICE as EMBEDDER_SERVICE
from dwsearch.clients.embedder import EmbedderClient
from dwsearch.clients.reranker import SERVICE as RERANKER_SERVICE
from dwsearch.clients.reranker import RerankerClient
from dwsearch.common import errors
from dwsearch.common.config import ModelCheckConfig
from dwsearch.common.tls import ClientTls, client_tls
from dwsearch.modelserver import probeset
from dwsearch.modelserver.quantcheck import QuantizationCheck
from dwsearch.v1 import embedder_pb2, embedder_pb2_grpc, reranker_pb2, reranker_pb2_grpc

EXIT_OK = 0
EXIT_FAILED = 1  # a check is below its threshold (the table says which)
EXIT_UNREACHABLE = 2  # a service could not be reached or refused the caller: the check is incomplete

# Query language → document language: English against each of the others, and back.
DIRECTIONS: tuple[tuple[str, str], ...] = (
    ("en", "ms"),
    ("en", "zh"),
    ("en", "rojak"),
    ("ms", "en"),
    ("zh", "en"),
    ("rojak", "en"),
)

# Thresholds, per direction over the probe set's 14 topics, set between what was measured
# (docs/operations/rollout.md, "The probe set"): the worst direction of `use` (the dev default) is hit@1
# 0.79-0.86 / hit@3 1.00, of multilingual-e5-small 0.86 / 0.93; the best direction of the
# English-only all-MiniLM-L6-v2 is 0.29 / 0.50. Each keeps at least two topics of margin
# on either side.
# hit@1: the matching message must be the best match for most topics; below it a search
# in one language mostly answers with another topic's chat.
MIN_HIT_AT_1 = 0.6
# hit@3: the matching message within the first three for most topics; below it agents
# would not find it on the first screen of hits.
MIN_HIT_AT_3 = 0.7
# Reranker: the share of probes whose relevant document it puts first. Each probe's
# answer is unambiguous, so a working cross-encoder gets nearly all; one miss is allowed.
MIN_RERANK_FIRST = 0.8
# A probe vector's norm may be this far from 1 (the embedder normalizes: a vector that is
# not unit length was computed wrong, or came back from a NaN).
NORM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class ServiceInfo:
    """What a model service's Info says about how it computes."""

    service: str  # "embedder" or "reranker"
    address: str
    model_id: str
    revision: str = ""
    backend: str = ""
    runtime: str = ""
    device: str = ""
    dtype: str = ""
    dimension: int = 0
    served_models: tuple[str, ...] = ()
    cpu_class: str = ""
    quantization: str = ""
    note: str = ""
    # None: the service made or considered no int8 export (or predates the report).
    quantization_check: QuantizationCheck | None = None


@dataclass(frozen=True)
class Recall:
    hit_at_1: float
    hit_at_3: float
    mrr: float


@dataclass(frozen=True)
class Check:
    """One row of the table."""

    name: str
    figure: str
    threshold: str
    ok: bool


@dataclass
class Outcome:
    """What `collect` found: the services' descriptions, the checks, and why nothing
    could be checked (`unreachable`, empty when the services answered)."""

    infos: list[ServiceInfo] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    unreachable: str = ""

    @property
    def exit_code(self) -> int:
        if self.unreachable:
            return EXIT_UNREACHABLE
        return EXIT_OK if all(c.ok for c in self.checks) else EXIT_FAILED


class Unreachable(Exception):
    """A service cannot be reached, or refuses the caller (wrong token, TLS)."""


# --- scoring (plain data) ---------------------------------------------------------------


def ranks(queries: np.ndarray, documents: np.ndarray) -> list[int]:
    """For each query i, the 1-based rank of document i among all documents by cosine.
    A document scoring the same as the right one ranks above it: a model that embeds
    every text of a script alike must not score hits by the order of the list."""
    q = _unit(queries)
    d = _unit(documents)
    scores = q @ d.T
    out = []
    for i, row in enumerate(scores):
        others = np.delete(row, i)
        out.append(1 + int(np.count_nonzero(others >= row[i])))
    return out


def _unit(vectors: np.ndarray) -> np.ndarray:
    matrix = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


def recall(rank_list: Sequence[int]) -> Recall:
    """hit@1, hit@3 and mean reciprocal rank of 1-based ranks."""
    if not rank_list:
        return Recall(0.0, 0.0, 0.0)
    n = len(rank_list)
    return Recall(
        hit_at_1=sum(r == 1 for r in rank_list) / n,
        hit_at_3=sum(r <= 3 for r in rank_list) / n,
        mrr=sum(1 / r for r in rank_list) / n,
    )


def cross_lingual_recall(
    queries: dict[str, np.ndarray], documents: dict[str, np.ndarray]
) -> dict[tuple[str, str], Recall]:
    """Per direction (query language, document language): row i of each matrix is topic
    i's message (TOPICS order), embedded as a query and as a document."""
    return {(q, d): recall(ranks(queries[q], documents[d])) for q, d in DIRECTIONS}


def recall_checks(by_direction: dict[tuple[str, str], Recall]) -> list[Check]:
    checks = []
    for (q, d), r in by_direction.items():
        checks.append(
            Check(
                f"cross-lingual {q}→{d} hit@1",
                f"{r.hit_at_1:.2f}",
                f"≥ {MIN_HIT_AT_1:.2f}",
                r.hit_at_1 >= MIN_HIT_AT_1,
            )
        )
        checks.append(
            Check(
                f"cross-lingual {q}→{d} hit@3",
                f"{r.hit_at_3:.2f} (MRR {r.mrr:.2f})",
                f"≥ {MIN_HIT_AT_3:.2f}",
                r.hit_at_3 >= MIN_HIT_AT_3,
            )
        )
    return checks


def embedding_checks(vectors: Sequence[np.ndarray], dimension: int) -> list[Check]:
    """Every probe vector finite, of Info's dimension and unit length."""
    bad = 0
    for v in vectors:
        array = np.asarray(v, dtype=np.float64)
        finite = bool(np.all(np.isfinite(array)))
        if (
            not finite
            or array.shape != (dimension,)
            or abs(float(np.linalg.norm(array)) - 1) > NORM_TOLERANCE
        ):
            bad += 1
    return [
        Check(
            "embedder probe vectors",
            f"{len(vectors) - bad}/{len(vectors)} well-formed",
            f"all finite, {dimension}-d, unit length",
            bad == 0 and len(vectors) > 0,
        )
    ]


def rerank_checks(results: Sequence[Sequence[tuple[int, float]]]) -> list[Check]:
    """`results`: each probe's Rerank answer, (document index, score) pairs. The relevant
    document (index 0) counts as first only when it scores above every other one."""
    first = 0
    finite = True
    for pairs in results:
        scores = dict(pairs)
        finite = finite and all(math.isfinite(s) for s in scores.values())
        others = [s for i, s in scores.items() if i != 0]
        if 0 in scores and all(scores[0] > s for s in others):
            first += 1
    share = first / len(results) if results else 0.0
    return [
        Check(
            "reranker relevant document first",
            f"{share:.2f} ({first}/{len(results)} probes)",
            f"≥ {MIN_RERANK_FIRST:.2f}",
            share >= MIN_RERANK_FIRST,
        ),
        Check("reranker scores finite", "yes" if finite else "no", "all finite", finite),
    ]


def info_checks(info: ServiceInfo, expected_model: str = "") -> list[Check]:
    """The model the service serves (when one is expected) and its int8 check."""
    checks = []
    if expected_model:
        serves = info.model_id == expected_model
        checks.append(Check(f"{info.service} model", info.model_id or "(none)", expected_model, serves))
    report = info.quantization_check
    if report is None:
        figure = "not run" + (f" (quantization {info.quantization})" if info.quantization else "")
        checks.append(Check(f"{info.service} int8 check", figure, "passed, when run", True))
    else:
        figure = "passed" if report.passed else f"FAILED: {report.failure or 'no reason given'}"
        if report.rerank_order_same or report.rerank_logit_max_diff:
            figure += f" (order same {report.rerank_order_same:.2f}, logit diff ≤ {report.rerank_logit_max_diff:.3f})"
        elif report.probes:
            figure += f" (dense cos min {report.dense_cosine_min:.3f}, mean {report.dense_cosine_mean:.3f})"
        checks.append(Check(f"{info.service} int8 check", figure, "passed", report.passed))
    return checks


def describe(info: ServiceInfo) -> list[str]:
    """Lines naming what the service runs."""
    lines = [
        f"{info.service} {info.address}",
        f"  model {info.model_id} revision {info.revision or '-'} backend {info.backend or '-'}",
        f"  runtime {info.runtime or '-'} device {info.device or '-'} dtype {info.dtype or '-'}"
        + (f" dimension {info.dimension}" if info.dimension else ""),
        f"  cpu class {info.cpu_class or '-'} quantization {info.quantization or '-'}",
    ]
    if len(info.served_models) > 1:
        lines.append(f"  serves {', '.join(info.served_models)}")
    check = info.quantization_check
    if check is not None:
        lines.append(
            f"  int8 check {'passed' if check.passed else 'FAILED'} on {check.cpu_class or '-'}: {check.probes} probes, "
            f"dense cosine mean {check.dense_cosine_mean:.4f} min {check.dense_cosine_min:.4f}, "
            f"sparse top terms same {check.sparse_top_terms_same:.2f}, rerank order same {check.rerank_order_same:.2f}, "
            f"logit max diff {check.rerank_logit_max_diff:.4f}"
            + (f"; {check.failure}" if check.failure else "")
        )
    if info.note:
        lines.append(f"  note: {info.note}")
    return lines


def table(checks: Sequence[Check]) -> str:
    """One row per check: check, figure, threshold, ok / FAIL."""
    header = ("check", "figure", "threshold", "result")
    rows = [(c.name, c.figure, c.threshold, "ok" if c.ok else "FAIL") for c in checks]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(3)]
    lines = []
    for row in (header, *rows):
        lines.append(
            "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
        )
    return "\n".join(lines)


def report(outcome: Outcome) -> str:
    """What the command prints: each service's description, the table of what was checked
    and the verdict (when a service could not be reached, why: the checks are incomplete)."""
    lines = [line for info in outcome.infos for line in describe(info)]
    if outcome.checks:
        lines += ["", table(outcome.checks), ""]
    failed = [c.name for c in outcome.checks if not c.ok]
    if outcome.unreachable:
        lines.append(f"model-check: not checked: {outcome.unreachable}")
    elif failed:
        lines.append(f"model-check: FAILED ({len(failed)} of {len(outcome.checks)} checks)")
    else:
        lines.append("model-check: ok")
    return "\n".join(lines).lstrip("\n")


# --- the services (gRPC) ----------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where and how to call the services."""

    embedder_addr: str
    reranker_addr: str = ""
    model: str = ""  # the embedding model to check; empty = the embedder's default
    auth_token: str = ""
    tls: ClientTls | None = None
    timeout: float = 60.0


def runtime_report(
    message: embedder_pb2.ModelRuntimeReport,
) -> tuple[str, str, str, QuantizationCheck | None]:
    """(cpu_class, quantization, note, quantization check) of a ModelRuntimeReport."""
    check = None
    if message.HasField("quantization_check"):
        check = QuantizationCheck.from_pb(message.quantization_check)
    return message.cpu_class, message.quantization, message.note, check


def embedder_info(address: str, response: embedder_pb2.EmbedderServiceInfoResponse) -> ServiceInfo:
    cpu_class, quantization, note, check = runtime_report(response.runtime_report)
    return ServiceInfo(
        service="embedder", address=address, model_id=response.model_id, revision=response.revision,
        backend=response.backend, runtime=response.runtime, device=response.device, dtype=response.dtype,
        dimension=response.dimension, served_models=tuple(response.served_models), cpu_class=cpu_class,
        quantization=quantization, note=note, quantization_check=check,
    )  # fmt: skip


def reranker_info(address: str, response: reranker_pb2.RerankerServiceInfoResponse) -> ServiceInfo:
    cpu_class, quantization, note, check = runtime_report(response.runtime_report)
    return ServiceInfo(
        service="reranker", address=address, model_id=response.model_id, revision=response.revision,
        runtime=response.runtime, device=response.device, dtype=response.dtype, cpu_class=cpu_class,
        quantization=quantization, note=note, quantization_check=check,
    )  # fmt: skip


# Codes that mean the check could not run at all: nothing answered, or the service
# refused the caller before looking at the request.
_UNREACHABLE = {
    grpc.StatusCode.UNAVAILABLE: "cannot be reached",
    grpc.StatusCode.DEADLINE_EXCEEDED: "did not answer in time",
    grpc.StatusCode.UNAUTHENTICATED: "refused the token (DWSEARCH_AUTH_TOKEN)",
    grpc.StatusCode.PERMISSION_DENIED: "refused the token (DWSEARCH_AUTH_TOKEN)",
}


def _refusal(exc: grpc.aio.AioRpcError, service: str, address: str) -> Unreachable | None:
    """Unreachable when `exc` means the check cannot run; None for any other failure."""
    why = _UNREACHABLE.get(exc.code())
    if why is None:
        return None
    return Unreachable(f"{service} at {address} {why}: {exc.code().name}: {exc.details()}")


_REFUSED = (errors.Unavailable, errors.DeadlineExceeded, errors.Unauthenticated, errors.PermissionDenied)


async def collect(target: Target) -> Outcome:
    """Call the services and score what they answer."""
    outcome = Outcome()
    try:
        await _embedder(target, outcome)
        if target.reranker_addr:
            await _reranker(target, outcome)
    except Unreachable as exc:
        outcome.unreachable = str(exc)
    return outcome


async def _embedder(target: Target, outcome: Outcome) -> None:
    address = target.embedder_addr
    channel = open_channel(address, [EMBEDDER_SERVICE], target.tls)
    try:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        request = embedder_pb2.EmbedderServiceInfoRequest(model=target.model)
        response = await stub.Info(request, timeout=target.timeout, metadata=auth_metadata(target.auth_token))
    except grpc.aio.AioRpcError as exc:
        if (refused := _refusal(exc, "embedder", address)) is not None:
            raise refused from None
        # e.g. FAILED_PRECONDITION: it does not serve that model
        outcome.checks.append(
            Check("embedder model", f"{exc.code().name}: {exc.details()}", target.model, False)
        )
        return
    finally:
        await channel.close()
    info = embedder_info(address, response)
    outcome.infos.append(info)
    outcome.checks.extend(info_checks(info, target.model))

    client = EmbedderClient(
        address, timeout=target.timeout, auth_token=target.auth_token, tls=target.tls, model=info.model_id
    )
    queries: dict[str, np.ndarray] = {}
    documents: dict[str, np.ndarray] = {}
    vectors: list[np.ndarray] = []
    try:
        for language in probeset.LANGUAGES:
            texts = [topic.text(language) for topic in probeset.TOPICS]
            for input_type, into in (("query", queries), ("document", documents)):
                embedded = await client.embed(texts, input_type=input_type, priority="interactive")
                into[language] = np.stack([_dense(e.dense) for e in embedded])
                vectors.extend(into[language])
        for input_type, more in (("document", probeset.WINDOWS), ("query", probeset.QUERIES)):
            embedded = await client.embed(list(more), input_type=input_type, priority="interactive")
            vectors.extend(_dense(e.dense) for e in embedded)
    except _REFUSED as exc:
        raise Unreachable(f"embedder at {address}: Embed failed: {exc}") from None
    except errors.DwsearchError as exc:  # ModelMismatch: a pod of another model answered (mid-rollout)
        outcome.checks.append(Check("embedder Embed", str(exc), "answers the probe set", False))
        return
    finally:
        await client.close()
    outcome.checks.extend(embedding_checks(vectors, info.dimension))
    outcome.checks.extend(recall_checks(cross_lingual_recall(queries, documents)))


def _dense(vector: np.ndarray | None) -> np.ndarray:
    return np.zeros(0, dtype=np.float32) if vector is None else vector


async def _reranker(target: Target, outcome: Outcome) -> None:
    address = target.reranker_addr
    channel = open_channel(address, [RERANKER_SERVICE], target.tls)
    try:
        stub = reranker_pb2_grpc.RerankerServiceStub(channel)
        request = reranker_pb2.RerankerServiceInfoRequest()
        response = await stub.Info(request, timeout=target.timeout, metadata=auth_metadata(target.auth_token))
    except grpc.aio.AioRpcError as exc:
        if (refused := _refusal(exc, "reranker", address)) is not None:
            raise refused from None
        outcome.checks.append(Check("reranker Info", f"{exc.code().name}: {exc.details()}", "answers", False))
        return
    finally:
        await channel.close()
    info = reranker_info(address, response)
    outcome.infos.append(info)
    outcome.checks.extend(info_checks(info))
    client = RerankerClient(address, timeout=target.timeout, auth_token=target.auth_token, tls=target.tls)
    try:
        # Raw logits: a sigmoid can round two strong scores to the same 1.0.
        results = [
            await client.rerank(probe.query, list(probe.documents), raw_scores=True)
            for probe in probeset.RERANK_PROBES
        ]
    except _REFUSED as exc:
        raise Unreachable(f"reranker at {address}: Rerank failed: {exc}") from None
    except errors.DwsearchError as exc:
        outcome.checks.append(Check("reranker Rerank", str(exc), "answers the probes", False))
        return
    finally:
        await client.close()
    outcome.checks.extend(rerank_checks(results))


def target_of(cfg: ModelCheckConfig) -> Target:
    return Target(
        embedder_addr=cfg.embedder_addr,
        reranker_addr=cfg.reranker_addr,
        model=cfg.embed_model,
        auth_token=cfg.auth_token,
        tls=client_tls(cfg.tls_ca, cfg.tls_client_cert, cfg.tls_client_key),
        timeout=cfg.timeout_seconds,
    )


def run_command(cfg: ModelCheckConfig) -> int:
    """`dwsearch model-check`: the report on stdout (the reason on stderr when a service
    could not be reached); the exit status of the outcome."""
    outcome = asyncio.run(collect(target_of(cfg)))
    text = report(outcome)
    print(text, file=sys.stderr if outcome.unreachable else sys.stdout)
    return outcome.exit_code
