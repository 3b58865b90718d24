"""Exporting to ONNX: `dwsearch export-onnx`, the export a service makes on first start
(in a child process, into the cache, reused after), exports found in the model directory,
atomicity under concurrency and crashes, and failures that say what went wrong."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import pytest

from dwsearch.common.errors import StartupError
from dwsearch.modelserver import cpuclass, onnxexport, onnxsession, quantizer
from dwsearch_embedder.backends.base import BackendInfo
from dwsearch_embedder.backends.bge_m3 import BgeM3Backend

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dwsearch.cli", "export-onnx", "--log-format", "text", *args],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip


@pytest.fixture
def model_copy(tmp_path: Path, tiny_bge_m3_dir: Path) -> Path:
    return Path(shutil.copytree(tiny_bge_m3_dir, tmp_path / "bge-m3-tiny"))


@pytest.mark.slow
def test_export_onnx_writes_beside_the_weights_and_the_service_uses_it(model_copy, tmp_path):
    # int8 is this CPU class's variant (8-bit with VNNI, 7-bit on AVX2), in its own folder.
    variant = cpuclass.int8_variant(cpuclass.detect())
    output = model_copy / "onnx" / onnxexport.VARIANT_DIR[variant]
    done = cli("--model", str(model_copy), "--quantize", "int8", "--output", str(output), "--threads", "1")
    assert done.returncode == 0, done.stderr
    assert f"embedder bge-m3 {variant}" in done.stdout
    assert "int8 check against float32 passed: dense cosine mean 0.99" in done.stdout
    manifest = json.loads((output / onnxexport.MANIFEST).read_text())
    assert manifest["outputs"] == ["dense", "sparse_weights"]
    assert (manifest["kind"], manifest["quantize"], manifest["opset"]) == ("embedder", variant, 17)
    assert (manifest["cpu_class"], manifest["weight_bits"]) == (
        cpuclass.detect(),
        cpuclass.WEIGHT_BITS[variant],
    )
    assert manifest["check"]["passed"] and manifest["check"]["cpu_class"] == cpuclass.detect()
    assert (output / "model.onnx").stat().st_size > 1_000_000
    assert not list(output.parent.glob(".*tmp*"))  # the temporary directory was renamed, not left

    cache = tmp_path / "cache"
    backend = BgeM3Backend(
        str(model_copy), device="cpu", runtime="onnx", quantize="int8", onnx_cache_dir=cache
    )
    info = backend.load()
    assert backend._onnx.directory == output
    assert not cache.exists()  # nothing exported: the model directory had it
    assert (info.dtype, info.runtime, info.sparse_supported) == ("int8", "onnx", True)

    again = cli("--model", str(model_copy), "--quantize", "int8", "--output", str(output), "--threads", "1")
    assert again.returncode == 0 and "up to date" in again.stdout


@pytest.mark.slow
def test_first_start_exports_into_the_cache_once(model_copy, tmp_path, monkeypatch):
    cache = tmp_path / "cache"

    def start() -> tuple[BgeM3Backend, BackendInfo]:
        backend = BgeM3Backend(
            str(model_copy), device="cpu", runtime="onnx", quantize="none", onnx_cache_dir=cache
        )
        return backend, backend.load()

    backend, info = start()
    entry = backend._onnx.directory
    assert entry.parent.parent == cache and entry.name.startswith("embedder-bge-m3-fp32-")
    assert backend._onnx.manifest["fingerprint"] in entry.name
    assert (info.runtime, info.dtype) == ("onnx", "float32")
    written = (entry / "model.onnx").stat().st_mtime_ns

    def no_export(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("exported again")

    monkeypatch.setattr(onnxexport, "export_in_child", no_export)
    second, _ = start()
    assert second._onnx.directory == entry and (entry / "model.onnx").stat().st_mtime_ns == written

    # Other weights are another export.
    (model_copy / "sparse_linear.pt").write_bytes((model_copy / "colbert_linear.pt").read_bytes()[:10])
    with pytest.raises(AssertionError, match="exported again"):
        start()


def test_a_bad_model_directory_is_a_clear_error(tmp_path):
    done = cli("--model", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert "missing does not exist" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(StartupError, match="cannot load"):
        BgeM3Backend(str(tmp_path), device="cpu", runtime="onnx", onnx_cache_dir=tmp_path / "c").load()


@pytest.mark.slow
def test_a_failed_export_on_start_says_why_and_leaves_nothing(model_copy, tmp_path):
    (model_copy / "model.safetensors").write_bytes(b"not safetensors")
    cache = tmp_path / "cache"
    backend = BgeM3Backend(
        str(model_copy), device="cpu", runtime="onnx", quantize="int8", onnx_cache_dir=cache
    )
    with pytest.raises(StartupError, match=r"ONNX export of bge-m3-tiny failed \(exit 2\)"):
        backend.load()
    assert [p.name for p in cache.rglob("*") if not p.name.endswith(".lock")] == ["bge-m3-tiny"]


def _write_manifest(directory: Path, **fields: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / onnxsession.MODEL_FILE).write_bytes(b"graph")
    manifest = {
        "format": onnxexport.FORMAT,
        "kind": "embedder",
        "backend": "bge-m3",
        "quantize": "int8",
        **fields,
    }
    (directory / onnxexport.MANIFEST).write_text(json.dumps(manifest))


def test_export_atomically_exports_once_under_concurrency(tmp_path):
    entry = tmp_path / "m" / "embedder-bge-m3-int8-abc"
    calls = []

    def slow_write(temporary: Path) -> None:
        calls.append(temporary)
        time.sleep(0.2)  # the export's cost: the other threads arrive while it runs
        _write_manifest(temporary)

    threads = [
        threading.Thread(target=onnxexport.export_atomically, args=(entry, slow_write)) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert onnxexport.read_manifest(entry) is not None
    assert sorted(p.name for p in entry.parent.iterdir()) == [f".{entry.name}.lock", entry.name]


def test_a_crashed_export_leaves_no_entry_and_the_next_one_cleans_up(tmp_path):
    entry = tmp_path / "embedder-bge-m3-int8-abc"

    def crash(temporary: Path) -> None:
        (temporary / onnxsession.MODEL_FILE).write_bytes(b"half a graph")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        onnxexport.export_atomically(entry, crash)
    assert not entry.exists()
    stale = tmp_path / f".{entry.name}.tmp-killed"  # what a SIGKILL mid-export leaves
    stale.mkdir()
    onnxexport.export_atomically(entry, lambda temporary: _write_manifest(temporary))
    assert not stale.exists() and onnxexport.read_manifest(entry) is not None


def test_never_deletes_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"someone's model")
    with pytest.raises(StartupError, match="holds no dwsearch export"):
        onnxexport.export_atomically(tmp_path, lambda temporary: _write_manifest(temporary))
    assert (tmp_path / "weights.bin").exists()


def test_model_directory_exports_must_be_ours_and_current(tmp_path):
    source = onnxexport.Source.of(tmp_path, "m", "sha256:1")
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "model.onnx").write_bytes(b"another tool's export")  # no manifest: not ours
    assert onnxexport.in_model_dir(source, "embedder", "bge-m3", "int8") is None
    _write_manifest(tmp_path / "onnx" / "int8", fingerprint="stale")
    assert onnxexport.in_model_dir(source, "embedder", "bge-m3", "int8") is None
    _write_manifest(tmp_path / "onnx" / "int8", fingerprint=source.fingerprint)
    assert onnxexport.in_model_dir(source, "embedder", "bge-m3", "int8") == tmp_path / "onnx" / "int8"
    assert onnxexport.in_model_dir(source, "embedder", "bge-m3", "none") is None
    assert onnxexport.in_model_dir(source, "reranker", "cross-encoder", "int8") is None


@pytest.mark.slow
def test_weights_in_external_files_are_gathered_and_quantized(tiny_bge_m3_dir, tmp_path):
    """Over 2 GB the TorchScript exporter writes every tensor (Constant nodes' included) to
    a file of its own: they are gathered into one page-aligned model.onnx.data, and the int8
    quantizer carries the float32 ones it keeps into its own data file. A tiny model saved
    that way must run as the inline one does."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from dwsearch_embedder.backends.bge_m3 import BgeM3Backend as Backend

    inline = tmp_path / "inline"
    onnxexport.export(Backend.export_spec(tiny_bge_m3_dir), inline, quantize="none", source={"model_id": "m"})
    graph = onnx.load(str(inline / "model.onnx"))
    scattered = tmp_path / "scattered" / "model.onnx"
    scattered.parent.mkdir()
    onnx.save_model(
        graph, str(scattered), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0
    )
    assert any(node.op_type == "Constant" for node in graph.graph.node)
    assert len(list(scattered.parent.iterdir())) > 20
    gathered = tmp_path / "gathered" / "model.onnx"
    onnxexport._gather_external_data(scattered, gathered)
    assert sorted(p.name for p in gathered.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    quantized = {}
    for name, source in (("inline", inline / "model.onnx"), ("gathered", gathered)):
        target = tmp_path / f"int8-{name}" / "model.onnx"
        target.parent.mkdir()
        quantizer.quantize_int8(source, target)
        quantized[name] = target
    assert (quantized["gathered"].parent / "model.onnx.data").is_file()
    assert not (quantized["inline"].parent / "model.onnx.data").exists()

    feeds = {
        "input_ids": np.array([[0, 1000, 2000, 2], [0, 3000, 2, 1]]),
        "attention_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]]),
    }

    def run(path: Path) -> list[np.ndarray]:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)

    for a, b in zip(run(inline / "model.onnx"), run(gathered), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(run(quantized["inline"]), run(quantized["gathered"]), strict=True):
        np.testing.assert_array_equal(a, b)
