"""The int8 guard and the CPU class: an int8 export is checked against float32 on the
shipped probe set when it is made, a failed one is never served (the service answers with
float32 and says why in Info, its log and a metric), an export whose 8-bit sums would
saturate this CPU's kernels is never loaded, and the CPU class is read from CPUID as ONNX
Runtime's kernels read it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest
from model_servers import LoadedEmbedding, embedder_server
from prometheus_client import REGISTRY

from dwsearch.export_onnx import Request, export
from dwsearch.modelserver import cpuclass, onnxexport, onnxload, onnxsession, probeset, quantcheck, quantizer
from dwsearch.modelserver.quantcheck import EmbeddingProbes, QuantizationCheck, RerankProbes
from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_embedder.backends.bge_m3 import BgeM3Backend

ROOT = Path(__file__).resolve().parents[2]


# --- the check's figures (pure) ------------------------------------------------------


def test_top_terms_the_same_up_to_ties_at_the_boundary():
    reference = {1: 0.9, 2: 0.8, 3: 0.7, 4: 0.6, 5: 0.5}
    assert quantcheck.TOP_TERMS == 3
    assert quantcheck.same_top_terms(reference, reference)
    # Weights move, the top three stay.
    assert quantcheck.same_top_terms(reference, {1: 0.85, 2: 0.82, 3: 0.65, 4: 0.6, 5: 0.55})
    # A clear top term falls out.
    assert not quantcheck.same_top_terms(reference, {1: 0.9, 2: 0.8, 3: 0.4, 4: 0.6, 5: 0.5})
    # The third and fourth within TERM_TIE of each other: either may be in.
    tied = {1: 0.9, 2: 0.8, 3: 0.6, 4: 0.58}
    assert quantcheck.same_top_terms(tied, {1: 0.9, 2: 0.8, 3: 0.57, 4: 0.6})
    assert quantcheck.same_top_terms({}, {})
    assert quantcheck.same_top_terms({7: 1.0}, {7: 0.9, 8: 0.1})


def test_rerank_order_the_same_up_to_ties():
    reference = np.array([2.0, -1.0, 0.5, 0.45])
    assert quantcheck.same_order(reference, reference + 0.05)
    assert quantcheck.same_order(reference, np.array([2.0, -1.0, 0.44, 0.46]))  # a tie swapped
    assert not quantcheck.same_order(reference, np.array([-1.0, 2.0, 0.5, 0.45]))


def _probes(vectors: list[list[float]], sparse: list[dict[int, float]] | None = None) -> EmbeddingProbes:
    return quantcheck.embedding_probes(np.array(vectors, dtype=np.float32), sparse)


def test_embedding_check_thresholds():
    reference = _probes([[1, 0], [0, 1], [1, 1]], [{1: 1.0}, {2: 1.0}, {3: 1.0}])
    same = quantcheck.compare(reference, reference, cpu_class="x86-vnni")
    assert same.passed and same.dense_cosine_min == pytest.approx(1.0) and same.sparse_top_terms_same == 1
    assert (same.cpu_class, same.probes, same.failure) == ("x86-vnni", 3, "")
    # One vector off by 20 degrees: the minimum fails (0.94 < 0.97), the mean holds? No: 0.98 < 0.99.
    turned = _probes([[1, 0], [0, 1], [1, 0.45]], [{1: 1.0}, {2: 1.0}, {3: 1.0}])
    failed = quantcheck.compare(reference, turned, cpu_class="x86-avx2")
    assert not failed.passed
    assert "dense cosine min 0.9" in failed.failure and "< 0.97" in failed.failure
    terms = quantcheck.compare(reference, _probes([[1, 0], [0, 1], [1, 1]], [{1: 1.0}, {2: 1.0}, {9: 1.0}]),
                               cpu_class="x86")  # fmt: skip
    assert not terms.passed and terms.failure == "sparse top terms differ on 1 of 3 probes"


def test_rerank_check_and_manifest_round_trip():
    reference = RerankProbes([np.array([3.0, 0.0, -2.0]), np.array([1.0, -1.0])])
    check = quantcheck.compare(reference, RerankProbes([np.array([2.9, 0.1, -2.0]), np.array([-1.0, 1.0])]),
                               cpu_class="arm64")  # fmt: skip
    assert (check.passed, check.kind, check.probes, check.rerank_order_same) == (False, "reranker", 5, 0.5)
    assert check.rerank_logit_max_diff == pytest.approx(2.0)
    assert "reordered on 1 of 2 probes" in check.failure
    assert QuantizationCheck.from_manifest(json.loads(json.dumps(check.to_manifest()))) == check
    assert QuantizationCheck.from_manifest(None) is None
    assert QuantizationCheck.from_manifest({"passed": True, "probes": "many"}) is None
    with pytest.raises(TypeError):
        quantcheck.compare(reference, _probes([[1, 0]]), cpu_class="x86")


# --- a broken int8 export is refused -------------------------------------------------


def _broken_to_int8(
    weight: np.ndarray, scale: np.ndarray, levels: int = 127, rows: int = 16384
) -> np.ndarray:
    """A quantizer with its scale off by 8: most weights clip at the ends of the range."""
    return np.clip(np.rint(weight / scale * 8), -levels, levels).astype(np.int8)


@pytest.mark.slow
async def test_a_broken_int8_export_is_refused_and_the_service_answers_with_float32(
    tiny_bge_m3_dir, tmp_path, monkeypatch, caplog
):
    model = Path(shutil.copytree(tiny_bge_m3_dir, tmp_path / "bge-m3-broken"))
    cache = tmp_path / "cache"
    export(Request(str(model), quantize="none", cache_dir=cache))
    with monkeypatch.context() as patched:
        patched.setattr(quantizer, "_to_int8", _broken_to_int8)
        directory, manifest, exported = export(Request(str(model), quantize="int8", cache_dir=cache))
    assert exported and manifest["cpu_class"] == cpuclass.detect()
    assert manifest["quantize"] == cpuclass.int8_variant(cpuclass.detect())
    check = QuantizationCheck.from_manifest(manifest["check"])
    assert check is not None and not check.passed
    assert check.probes == len(probeset.guard_texts()) and "dense cosine" in check.failure
    assert check.dense_cosine_min < quantcheck.DENSE_COSINE_MIN

    def no_export(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("exported again: the failed export and float32 are both in the cache")

    monkeypatch.setattr(onnxexport, "export_in_child", no_export)
    backend = BgeM3Backend(str(model), device="cpu", runtime="onnx", quantize="int8", onnx_cache_dir=cache)
    info = backend.load()
    assert backend._onnx.directory != directory and backend._onnx.manifest["quantize"] == "none"
    assert (info.runtime, info.dtype) == ("onnx", "float32")
    report = info.runtime_report
    assert (report.cpu_class, report.quantization, report.check) == (cpuclass.detect(), "none", check)
    assert "failed its check against float32" in report.note and "serving float32" in report.note
    assert "dense cosine min" in caplog.text and "serving float32" in caplog.text

    # Over gRPC: Info says so, Embed answers (with float32), the metric is set.
    async with embedder_server(LoadedEmbedding(backend)) as (_, channel):
        stub = pb_grpc.EmbedderServiceStub(channel)
        served = await stub.Info(pb.EmbedderServiceInfoRequest(), timeout=10)
        embedded = await stub.Embed(pb.EmbedRequest(inputs=["退款什么时候到账"]), timeout=10)
    assert served.dtype == "float32"
    assert served.runtime_report.quantization == "none" and "serving float32" in served.runtime_report.note
    assert served.runtime_report.cpu_class == cpuclass.detect()
    assert not served.runtime_report.quantization_check.passed
    assert served.runtime_report.quantization_check.dense_cosine_min == pytest.approx(check.dense_cosine_min)
    assert len(embedded.embeddings[0].dense) == info.dimension
    labels = {"service": "embedder", "model": info.model_id}
    assert REGISTRY.get_sample_value("dwsearch_model_int8_refused", labels) == 1
    runtime = {**labels, "runtime": "onnx", "cpu_class": cpuclass.detect(), "quantization": "none",
               "int8_check": "failed"}  # fmt: skip
    assert REGISTRY.get_sample_value("dwsearch_model_runtime_info", runtime) == 1


@pytest.mark.slow
def test_export_onnx_exits_non_zero_when_the_check_fails(tmp_path):
    """The command a pre-build Job runs: the check's figures, and exit 1 for a failed one.
    A quantizer cannot be broken in a child process, so the manifest is: the command reads
    an existing export's check and reports it."""
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / onnxsession.MODEL_FILE).write_bytes(b"graph")
    failed = QuantizationCheck(
        False, "x86-avx2", 40, 0.95, 0.41, 1.0, failure="dense cosine min 0.4100 < 0.97"
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    from dwsearch.modelserver.modelfiles import resolve_model

    resolved = resolve_model(str(model))
    source = onnxexport.Source.of(resolved.path, resolved.model_id, resolved.revision)
    manifest = {"format": onnxexport.FORMAT, "kind": "embedder", "backend": "bge-m3", "export_seconds": 1,
                "quantize": cpuclass.int8_variant(cpuclass.detect()), "bytes": 5, "check": failed.to_manifest(),
                "fingerprint": source.fingerprint}  # fmt: skip
    (entry / onnxexport.MANIFEST).write_text(json.dumps(manifest))
    done = subprocess.run(
        [sys.executable, "-m", "dwsearch.cli", "export-onnx", "--model", str(model), "--backend", "bge-m3",
         "--output", str(entry), "--log-format", "text"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "int8 check against float32 FAILED: dense cosine mean 0.9500 min 0.4100" in done.stdout
    assert "will not serve this export" in done.stderr


def test_a_child_export_whose_check_failed_is_not_a_start_up_error(tmp_path, monkeypatch):
    """The service exports in a child (`dwsearch export-onnx`), which exits 1 when the int8
    check fails: the export is there, and `load` serves float32 instead of failing to start."""
    entry = tmp_path / "entry"

    def child(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        entry.mkdir()
        (entry / onnxsession.MODEL_FILE).write_bytes(b"graph")
        (entry / onnxexport.MANIFEST).write_text(
            json.dumps({"format": onnxexport.FORMAT, "kind": "embedder"})
        )
        return subprocess.CompletedProcess(
            command, onnxexport.EXIT_CHECK_FAILED, "", "error: sparse top terms differ"
        )

    monkeypatch.setattr(onnxexport.subprocess, "run", child)
    source = onnxexport.Source(tmp_path, "m", "r", "f")
    onnxexport.export_in_child("embedder", "bge-m3", source, "int8", entry, 1)  # no StartupError
    shutil.rmtree(entry)

    def failed(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(command, onnxexport.EXIT_CHECK_FAILED, "", "boom")

    monkeypatch.setattr(onnxexport.subprocess, "run", failed)
    with pytest.raises(onnxexport.StartupError, match=r"failed \(exit 1\): boom"):
        onnxexport.export_in_child("embedder", "bge-m3", source, "int8", entry, 1)


# --- the CPU class ---------------------------------------------------------------------


def test_an_8bit_export_is_never_loaded_where_its_sums_saturate(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(cpuclass, "detect", lambda: cpuclass.X86_AVX2)
    passed = QuantizationCheck(True, cpuclass.X86_VNNI, 40, 0.999, 0.998, 1.0)
    exported = tmp_path / "model" / "onnx" / "int8"
    exported.mkdir(parents=True)
    (exported / onnxsession.MODEL_FILE).write_bytes(b"graph")
    (exported / onnxexport.MANIFEST).write_text(json.dumps({
        "format": onnxexport.FORMAT, "kind": "embedder", "backend": "bge-m3", "quantize": "int8",
        "cpu_class": cpuclass.X86_VNNI, "fingerprint": "f", "check": passed.to_manifest(),
    }))  # fmt: skip
    source = onnxexport.Source(tmp_path / "model", "m", "r", "f")
    # On AVX2 int8 is the 7-bit variant: the 8-bit export beside the weights is passed over.
    choice = onnxload.choose_runtime("auto", "int8", device="cpu", dtype="auto")
    assert choice.quantize == cpuclass.INT8_7BIT
    assert onnxexport.in_model_dir(source, "embedder", "bge-m3", choice.quantize) is None
    assert "saturate this CPU's (x86-avx2) int8 kernels" in caplog.text
    # And were one handed to it, it is refused, not served.
    manifest = json.loads((exported / onnxexport.MANIFEST).read_text())
    assert "saturate" in onnxload._refusal(manifest, passed, cpuclass.X86_AVX2)
    assert onnxload._refusal(manifest, passed, cpuclass.X86_VNNI) == ""
    assert onnxload._refusal(manifest, None, cpuclass.X86_VNNI) == "was never checked against float32"
    assert cpuclass.runs_exactly("int8-7bit", cpuclass.X86_AVX2)
    assert not cpuclass.runs_exactly("int8", cpuclass.OTHER)


def test_an_export_of_the_older_format_is_exported_again(tmp_path):
    entry = tmp_path / "embedder-bge-m3-int8-f"
    entry.mkdir()
    (entry / onnxsession.MODEL_FILE).write_bytes(b"old graph")
    (entry / onnxexport.MANIFEST).write_text(
        json.dumps({"format": 1, "kind": "embedder", "quantize": "int8"})
    )

    def write(temporary: Path) -> None:
        (temporary / onnxsession.MODEL_FILE).write_bytes(b"new graph")
        (temporary / onnxexport.MANIFEST).write_text(
            json.dumps({"format": onnxexport.FORMAT, "kind": "embedder"})
        )

    assert onnxexport.export_atomically(entry, write) == entry
    assert (entry / onnxsession.MODEL_FILE).read_bytes() == b"new graph"


def test_the_cpu_class_comes_from_cpuid():
    from numpy._core._multiarray_umath import __cpu_features__ as features

    detected = cpuclass.detect()
    assert detected in cpuclass.CLASSES
    if detected == cpuclass.X86_VNNI:
        assert features["AVX512VNNI"]
    elif detected == cpuclass.X86_AVX2:
        assert features["AVX2"] and not features["AVX512VNNI"]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("qemu-x86_64") is None, reason="needs Debian's qemu-user (apt-get install qemu-user)"
)
def test_an_emulated_avx2_cpu_is_classed_by_its_cpuid_not_proc_cpuinfo():
    """Under qemu-user /proc/cpuinfo still shows the host's flags; CPUID is Haswell's, and
    ONNX Runtime's kernels follow CPUID."""
    done = subprocess.run(
        ["qemu-x86_64", "-cpu", "Haswell", sys.executable, "-c",
         "from dwsearch.modelserver import cpuclass, onnxload; c = cpuclass.detect(); "
         "print(c, onnxload.choose_runtime('auto', 'auto', device='cpu', dtype='auto').quantize)"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [cpuclass.X86_AVX2, cpuclass.INT8_7BIT]
