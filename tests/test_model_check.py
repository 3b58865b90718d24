"""`dwsearch model-check`: the scoring functions on plain data; the whole check over real
sockets against fake services that answer as a good (or a broken) model would; and the
command against real `dwsearch embedder` processes: `use` (the dev default) passes, the
English-only MiniLM fails with the table, an address where nothing listens exits 2."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from dwsearch import modelcheck as mc
from dwsearch.common.grpchost import GrpcHost, Service
from dwsearch.modelserver import probeset
from dwsearch.modelserver.quantcheck import QuantizationCheck
from dwsearch.v1 import embedder_pb2, embedder_pb2_grpc, reranker_pb2, reranker_pb2_grpc
from dwsearch_testkit.net import free_port
from dwsearch_testkit.procs import SERVING, base_env, health

# A model process on the shared two-core machine: one thread each.
THREADS_ENV = {
    "DWSEARCH_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


# `use` is SERVING within seconds, MiniLM under torch in about 20 s on a quiet machine.
EMBEDDER_START_S = 180


# --- scoring ------------------------------------------------------------------------------


def test_ranks_and_recall():
    same = np.eye(4)
    assert mc.ranks(same, same) == [1, 1, 1, 1]
    # Query 0 is closest to document 1; the others find their own.
    queries = np.array([[0.6, 0.8, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    assert mc.ranks(queries, same) == [2, 1, 1, 1]
    assert mc.recall([1, 2, 4, 1]) == mc.Recall(hit_at_1=0.5, hit_at_3=0.75, mrr=(1 + 0.5 + 0.25 + 1) / 4)
    assert mc.recall([]) == mc.Recall(0.0, 0.0, 0.0)


def test_a_tie_ranks_the_right_document_below():
    """A model that embeds every text of a script alike (English-only models on Chinese)
    must not score hits by the order of the list."""
    alike = np.ones((3, 4))
    assert mc.ranks(alike, alike) == [3, 3, 3]


def test_cross_lingual_recall_covers_each_direction_and_the_thresholds_judge_it():
    n = len(probeset.TOPICS)
    perfect = {language: np.eye(n) for language in probeset.LANGUAGES}
    by_direction = mc.cross_lingual_recall(perfect, perfect)
    assert set(by_direction) == set(mc.DIRECTIONS)
    assert {("en", "ms"), ("ms", "en"), ("en", "zh"), ("zh", "en"), ("en", "rojak"), ("rojak", "en")} == set(
        mc.DIRECTIONS
    )
    checks = mc.recall_checks(by_direction)
    assert len(checks) == 2 * len(mc.DIRECTIONS) and all(c.ok for c in checks)

    # Malay documents shuffled: every en→ms query finds another topic.
    shuffled = dict(perfect, ms=np.roll(np.eye(n), 1, axis=0))
    checks = {c.name: c for c in mc.recall_checks(mc.cross_lingual_recall(perfect, shuffled))}
    assert not checks["cross-lingual en→ms hit@1"].ok and checks["cross-lingual en→ms hit@1"].figure == "0.00"
    assert checks["cross-lingual ms→en hit@1"].ok  # Malay queries against English documents
    assert checks["cross-lingual en→zh hit@3"].ok


def test_thresholds_at_the_edge():
    r = mc.Recall(hit_at_1=mc.MIN_HIT_AT_1, hit_at_3=mc.MIN_HIT_AT_3, mrr=0.7)
    assert all(c.ok for c in mc.recall_checks({("en", "ms"): r}))
    below = mc.Recall(hit_at_1=mc.MIN_HIT_AT_1 - 0.01, hit_at_3=mc.MIN_HIT_AT_3, mrr=0.7)
    assert [c.ok for c in mc.recall_checks({("en", "ms"): below})] == [False, True]


def test_embedding_checks():
    good = [np.array([0.6, 0.8]), np.array([1.0, 0.0])]
    assert mc.embedding_checks(good, 2)[0].ok
    for bad in (np.array([np.nan, 1.0]), np.array([0.5, 0.5]), np.array([1.0, 0.0, 0.0])):
        check = mc.embedding_checks([*good, bad], 2)[0]
        assert not check.ok and check.figure == "2/3 well-formed"
    assert not mc.embedding_checks([], 2)[0].ok


def test_rerank_checks():
    # (document index, score), best first, as RerankerClient returns them.
    right = [(0, 3.0), (2, 1.0), (1, -1.0)]
    wrong = [(1, 3.0), (0, 1.0), (2, -1.0)]
    tie = [(0, 2.0), (1, 2.0), (2, 0.0)]
    first, finite = mc.rerank_checks([right] * 5)
    assert first.ok and first.figure == "1.00 (5/5 probes)" and finite.ok
    first, _ = mc.rerank_checks([right] * 4 + [wrong])
    assert first.ok and first.figure == "0.80 (4/5 probes)"  # one miss in five is allowed
    first, _ = mc.rerank_checks([right] * 3 + [wrong, tie])
    assert not first.ok and first.figure == "0.60 (3/5 probes)"  # a tie is not first
    _, finite = mc.rerank_checks([right, [(0, math.nan), (1, 0.0)]])
    assert not finite.ok
    assert not mc.rerank_checks([])[0].ok


def test_info_checks_fail_a_failed_int8_check_and_another_model():
    info = mc.ServiceInfo(service="embedder", address="a", model_id="BAAI/bge-m3", quantization="int8")
    assert [(c.name, c.ok) for c in mc.info_checks(info)] == [("embedder int8 check", True)]
    assert mc.info_checks(info)[0].figure == "not run (quantization int8)"
    checks = mc.info_checks(info, "BAAI/bge-m3")
    assert [c.ok for c in checks] == [True, True]
    assert not mc.info_checks(info, "intfloat/multilingual-e5-small")[0].ok

    failed = QuantizationCheck(
        passed=False, cpu_class="x86-avx2", probes=76, dense_cosine_mean=0.95, dense_cosine_min=0.41,
        failure="dense cosine min 0.410 < 0.97",
    )  # fmt: skip
    (check,) = mc.info_checks(replace(info, quantization_check=failed))
    assert not check.ok and "dense cosine min 0.410 < 0.97" in check.figure
    passed = replace(failed, passed=True, dense_cosine_min=0.995, failure="")
    (check,) = mc.info_checks(replace(info, quantization_check=passed))
    assert check.ok and check.figure.startswith("passed")


def test_the_table_has_one_row_per_check_and_the_verdict():
    checks = [mc.Check("a check", "0.90", "≥ 0.60", True), mc.Check("another", "0.10", "≥ 0.60", False)]
    lines = mc.table(checks).splitlines()
    assert lines[0].split() == ["check", "figure", "threshold", "result"]
    assert lines[1].endswith("ok") and lines[2].endswith("FAIL") and len(lines) == 3
    outcome = mc.Outcome(checks=checks)
    assert outcome.exit_code == mc.EXIT_FAILED
    assert mc.report(outcome).endswith("model-check: FAILED (1 of 2 checks)")
    assert mc.Outcome(checks=checks[:1]).exit_code == mc.EXIT_OK
    unreachable = mc.Outcome(checks=checks[:1], unreachable="reranker at x cannot be reached")
    assert unreachable.exit_code == mc.EXIT_UNREACHABLE
    assert "not checked: reranker at x cannot be reached" in mc.report(unreachable)


# --- the whole check over real sockets, fake services ---------------------------------------


def _topic_of(text: str) -> int | None:
    for i, topic in enumerate(probeset.TOPICS):
        if text in (topic.text(language) for language in probeset.LANGUAGES):
            return i
    return None


@dataclass
class OracleEmbedder(embedder_pb2_grpc.EmbedderServiceServicer):
    """Embeds each topic's message, in any language, as that topic's axis (a perfect
    multilingual model); `blind` embeds every text alike (a model that cannot read it)."""

    model_id: str = "oracle"
    blind: bool = False
    report: embedder_pb2.ModelRuntimeReport | None = None

    @property
    def dimension(self) -> int:
        return len(probeset.TOPICS) + 1

    def vector(self, text: str) -> list[float]:
        v = [0.0] * self.dimension
        topic = None if self.blind else _topic_of(text)
        v[len(probeset.TOPICS) if topic is None else topic] = 1.0
        return v

    async def Embed(self, request, context):
        return embedder_pb2.EmbedResponse(
            embeddings=[embedder_pb2.Embedding(dense=self.vector(t), token_count=1) for t in request.inputs],
            model_id=self.model_id,
            dimension=self.dimension,
        )

    async def Info(self, request, context):
        if request.model and request.model != self.model_id:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"this embedder does not serve {request.model!r}"
            )
        response = embedder_pb2.EmbedderServiceInfoResponse(
            model_id=self.model_id, backend="oracle", dimension=self.dimension, runtime="onnx", device="cpu",
            dtype="int8", served_models=[self.model_id],
        )  # fmt: skip
        if self.report is not None:
            response.runtime_report.CopyFrom(self.report)
        return response


@dataclass
class OracleReranker(reranker_pb2_grpc.RerankerServiceServicer):
    """Scores each probe's relevant (first) document highest; `backwards` lowest."""

    backwards: bool = False

    async def Rerank(self, request, context):
        n = len(request.documents)
        scores = [float(n - i) for i in range(n)]
        if self.backwards:
            scores.reverse()
        order = sorted(range(n), key=lambda i: -scores[i])
        return reranker_pb2.RerankResponse(
            results=[reranker_pb2.RerankResult(index=i, score=scores[i]) for i in order],
            model_id="oracle-reranker",
        )

    async def Info(self, request, context):
        return reranker_pb2.RerankerServiceInfoResponse(
            model_id="oracle-reranker", runtime="onnx", device="cpu"
        )


async def _serve(name: str, add, servicer, **host_args) -> tuple[GrpcHost, str]:
    """A SERVING host of `servicer` on a free port, and its address."""
    host = GrpcHost("127.0.0.1:0", [Service(name, lambda s: add(servicer, s))], **host_args)
    port = await host.start()
    await host.set_serving(True)
    return host, f"127.0.0.1:{port}"


@pytest.fixture
async def serve_fakes() -> AsyncIterator:
    hosts: list[GrpcHost] = []

    async def start(embedder=None, reranker=None, **host_args) -> tuple[str, str]:
        addresses = []
        for servicer, name, add in (
            (
                embedder,
                "dwsearch.v1.EmbedderService",
                embedder_pb2_grpc.add_EmbedderServiceServicer_to_server,
            ),
            (
                reranker,
                "dwsearch.v1.RerankerService",
                reranker_pb2_grpc.add_RerankerServiceServicer_to_server,
            ),
        ):
            if servicer is None:
                addresses.append("")
                continue
            host, address = await _serve(name, add, servicer, **host_args)
            hosts.append(host)
            addresses.append(address)
        return addresses[0], addresses[1]

    yield start
    for host in hosts:
        await host.stop(0)


async def test_a_good_embedder_and_reranker_pass(serve_fakes):
    embedder, reranker = await serve_fakes(OracleEmbedder(), OracleReranker())
    outcome = await mc.collect(mc.Target(embedder_addr=embedder, reranker_addr=reranker, model="oracle"))
    assert outcome.exit_code == mc.EXIT_OK, mc.report(outcome)
    names = [c.name for c in outcome.checks]
    assert names[:3] == ["embedder model", "embedder int8 check", "embedder probe vectors"]
    assert "reranker relevant document first" in names and "reranker scores finite" in names
    assert [i.service for i in outcome.infos] == ["embedder", "reranker"]
    assert "model-check: ok" in mc.report(outcome)


async def test_a_reranker_that_ranks_wrong_fails(serve_fakes):
    embedder, reranker = await serve_fakes(OracleEmbedder(), OracleReranker(backwards=True))
    outcome = await mc.collect(mc.Target(embedder_addr=embedder, reranker_addr=reranker))
    failed = [c.name for c in outcome.checks if not c.ok]
    assert failed == ["reranker relevant document first"] and outcome.exit_code == mc.EXIT_FAILED


async def test_a_blind_embedder_fails_every_direction(serve_fakes):
    embedder, _ = await serve_fakes(OracleEmbedder(blind=True))
    outcome = await mc.collect(mc.Target(embedder_addr=embedder))
    failed = {c.name for c in outcome.checks if not c.ok}
    assert failed == {f"cross-lingual {q}→{d} hit@{k}" for q, d in mc.DIRECTIONS for k in (1, 3)}


async def test_a_failed_int8_check_in_info_fails(serve_fakes):
    report = embedder_pb2.ModelRuntimeReport(
        cpu_class="x86-avx2", quantization="none", note="the int8 export failed its check: serving float32",
        quantization_check=embedder_pb2.QuantizationCheck(
            passed=False, cpu_class="x86-avx2", probes=76, dense_cosine_mean=0.93, dense_cosine_min=0.41,
            failure="dense cosine min 0.410 < 0.97",
        ),
    )  # fmt: skip
    embedder, _ = await serve_fakes(OracleEmbedder(report=report))
    outcome = await mc.collect(mc.Target(embedder_addr=embedder))
    assert [c.name for c in outcome.checks if not c.ok] == ["embedder int8 check"]
    text = mc.report(outcome)
    assert "cpu class x86-avx2 quantization none" in text and "note: the int8 export failed its check" in text


async def test_an_embedder_of_another_model_fails(serve_fakes):
    embedder, _ = await serve_fakes(OracleEmbedder(model_id="model"))
    outcome = await mc.collect(mc.Target(embedder_addr=embedder, model="BAAI/bge-m3"))
    (check,) = outcome.checks
    assert check.name == "embedder model" and not check.ok and "FAILED_PRECONDITION" in check.figure


async def test_a_refused_token_or_no_server_is_unreachable(serve_fakes):
    embedder, _ = await serve_fakes(OracleEmbedder(), auth_token="right")
    outcome = await mc.collect(mc.Target(embedder_addr=embedder, auth_token="wrong"))
    assert outcome.exit_code == mc.EXIT_UNREACHABLE and "UNAUTHENTICATED" in outcome.unreachable
    assert (await mc.collect(mc.Target(embedder_addr=embedder, auth_token="right"))).exit_code == mc.EXIT_OK

    nowhere = f"127.0.0.1:{free_port()}"
    outcome = await mc.collect(mc.Target(embedder_addr=embedder, reranker_addr=nowhere, auth_token="right"))
    assert outcome.exit_code == mc.EXIT_UNREACHABLE
    assert outcome.unreachable.startswith(f"reranker at {nowhere} cannot be reached")
    assert outcome.checks and all(c.ok for c in outcome.checks)  # the embedder's, checked before


@pytest.mark.slow
async def test_the_tiny_random_cross_encoder_fails_the_reranker_check(serve_fakes, tmp_path):
    """A real RerankerService over a real (random) cross-encoder: it does not rank the
    probes' answers first, and the table says so."""
    from dwsearch_reranker.backends.cross_encoder import CrossEncoderBackend
    from dwsearch_reranker.engine import Reranker, RerankLimits
    from dwsearch_reranker.service import RerankerServicer
    from dwsearch_testkit.tiny_models import build_tiny_cross_encoder

    engine = Reranker(
        CrossEncoderBackend(str(build_tiny_cross_encoder(tmp_path / "reranker")), device="cpu"),
        RerankLimits(),
    )
    await engine.start()
    try:
        embedder, reranker = await serve_fakes(OracleEmbedder(), RerankerServicer(engine))
        outcome = await mc.collect(mc.Target(embedder_addr=embedder, reranker_addr=reranker))
    finally:
        await engine.stop()
    checks = {c.name: c for c in outcome.checks}
    assert not checks["reranker relevant document first"].ok, mc.report(outcome)
    assert checks["reranker scores finite"].ok
    assert outcome.exit_code == mc.EXIT_FAILED
    assert "reranker relevant document first" in mc.table(outcome.checks)


# --- the command against real embedders -------------------------------------------------


def _model_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dwsearch.cli", "model-check", *args],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@contextmanager
def embedder_process(tmp_path: Path, *args: str) -> Iterator[str]:
    """A real `dwsearch embedder` on a free port, SERVING; its address."""
    address = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "embedder.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dwsearch.cli",
            "embedder",
            "--listen-addr",
            address,
            "--log-format",
            "text",
            *args,
        ],
        env=base_env(**THREADS_ENV),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + EMBEDDER_START_S
        while health(address) != SERVING:
            log_text = (tmp_path / "embedder.log").read_text()
            assert proc.poll() is None, f"embedder exited with {proc.returncode}: {log_text[-3000:]}"
            assert time.monotonic() < deadline, (
                f"embedder not SERVING after {EMBEDDER_START_S} s: {log_text[-3000:]}"
            )
            time.sleep(0.2)  # polling a process's start-up, with a deadline
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.mark.slow
def test_the_dev_default_model_passes(tmp_path):
    with embedder_process(
        tmp_path, "--embed-model", "use-multilingual-v3", "--embed-backend", "use"
    ) as address:
        result = _model_check("--embedder-addr", address, "--model", "use-multilingual-v3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "model use-multilingual-v3" in result.stdout
    assert result.stdout.count(" ok") >= 2 * len(mc.DIRECTIONS) and "FAIL" not in result.stdout
    assert result.stdout.rstrip().endswith("model-check: ok")


@pytest.mark.slow
def test_an_english_only_model_fails_with_the_table(tmp_path):
    from dwsearch_testkit.tiny_models import minilm_dir

    # The model, not the runtime, is what fails here: torch, which every backend has.
    args = (
        "--embed-model",
        str(minilm_dir()),
        "--embed-backend",
        "sentence-transformers",
        "--embed-runtime",
        "torch",
    )
    with embedder_process(tmp_path, *args) as address:
        result = _model_check("--embedder-addr", address)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.split()[:2] == ["check", "figure"] for line in lines)
    failed = [line for line in lines if line.rstrip().endswith("FAIL")]
    assert any(line.startswith("cross-lingual en→zh hit@1") for line in failed), result.stdout
    assert any(line.startswith("cross-lingual ms→en hit@1") for line in failed), result.stdout
    assert "model-check: FAILED" in result.stdout


def test_an_unreachable_embedder_exits_2_naming_the_address():
    address = f"127.0.0.1:{free_port()}"
    result = _model_check("--embedder-addr", address, "--timeout-seconds", "10")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"embedder at {address} cannot be reached" in result.stderr
    assert "Traceback" not in result.stderr
