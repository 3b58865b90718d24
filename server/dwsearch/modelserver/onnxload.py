"""ONNX Runtime for the model services: choosing the runtime and the int8 variant that
serve on this CPU, and loading a model's export (found, or exported and cached:
dwsearch.modelserver.onnxexport) into a session (dwsearch.modelserver.onnxsession).

Runtime (`DWSEARCH_EMBED_RUNTIME`, shared by the embedder and the reranker):
- `auto`: ONNX Runtime on CPU (full-size bge-m3 on 2 cores: a 16-token query 2.2x, int8
  5x faster than torch; bench/results/onnx_fullsize.json), torch on a GPU (float16; ONNX
  Runtime's CUDA provider is unmeasured), and torch when a float16 / bfloat16 dtype is set;
- `torch` / `onnx`: that one; `onnx` on a GPU needs onnxruntime-gpu's CUDA provider.
Quantization (`DWSEARCH_QUANTIZE`): `int8` is ONNX Runtime's dynamic quantization (int8
weights per output channel, activations quantized per batch), CPU only, in the variant
whose sums are exact on this CPU class (dwsearch.modelserver.cpuclass: 8-bit weights with VNNI
or on ARM64, 7-bit ones elsewhere); `int8-7bit` asks for 7-bit weights on any CPU; `auto`
= the class's int8 with ONNX Runtime on a CPU class where int8 was measured both accurate
and faster than float32 (AUTO_INT8_CLASSES), none otherwise.

Every int8 export is checked against its float32 graph on the shipped probe set when it is
made (dwsearch.modelserver.quantcheck), and the check goes into its manifest with the CPU
class it was made on. An export that failed is never served: the service loads (or
exports) float32 instead and says why in Info, its log and a metric. An export whose
8-bit sums would saturate this CPU's kernels is never loaded either.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dwsearch.common.errors import StartupError
from dwsearch.modelserver import cpuclass
from dwsearch.modelserver.onnxexport import (
    VARIANT_DIR,
    Source,
    locate_or_export,
    manifest_matches,
    read_manifest,
)
from dwsearch.modelserver.onnxsession import OnnxModel, open_session
from dwsearch.modelserver.quantcheck import QuantizationCheck, RuntimeReport

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "onnx")
QUANTIZATIONS = ("auto", "none", cpuclass.INT8, cpuclass.INT8_7BIT)
# CPU classes where `quantize=auto` picks int8 with ONNX Runtime: measured there both as
# accurate as float32 (the guard's thresholds) and faster (docs/operations/runtime.md, "CPU classes").
# On the others int8 is unmeasured and `auto` keeps float32; `int8` opts in, checked.
AUTO_INT8_CLASSES = frozenset({cpuclass.X86_VNNI, cpuclass.X86_AVX2})


@dataclass(frozen=True)
class RuntimeChoice:
    runtime: str  # "torch" | "onnx"
    quantize: str  # "none" | "int8" | "int8-7bit"
    cpu_class: str = ""


def choose_runtime(
    runtime: str, quantize: str, *, device: str, dtype: str, cpu_class: str | None = None
) -> RuntimeChoice:
    """The runtime and quantization for `device` (resolved), the dtype setting and the CPU
    class (detected when not given)."""
    cpu = cpu_class or cpuclass.detect()
    if runtime not in RUNTIMES:
        raise StartupError(f"unknown runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if quantize not in QUANTIZATIONS:
        raise StartupError(f"unknown quantization {quantize!r}: expected one of {', '.join(QUANTIZATIONS)}")
    on_gpu = device.startswith("cuda")
    half = dtype not in ("auto", "float32")
    if runtime == "auto":
        runtime = "onnx" if quantize == "int8" or not (on_gpu or half) else "torch"
    if runtime == "torch":
        if quantize in cpuclass.INT8_VARIANTS:
            raise StartupError(
                "int8 quantization runs on ONNX Runtime: set the runtime to onnx or auto, not torch"
            )
        return RuntimeChoice("torch", "none", cpu)
    if half:
        raise StartupError(
            f"dtype {dtype} is for the torch runtime; ONNX Runtime runs the float32 graph or its int8 quantization"
        )
    if quantize == "auto":
        quantize = cpuclass.INT8 if not on_gpu and cpu in AUTO_INT8_CLASSES else "none"
    if quantize in cpuclass.INT8_VARIANTS and on_gpu:
        raise StartupError(
            "int8 (dynamic) quantization runs on CPU only; on a GPU use quantize none or the torch runtime"
        )
    if quantize == cpuclass.INT8:
        quantize = cpuclass.int8_variant(cpu)
    return RuntimeChoice("onnx", quantize, cpu)


def dtype_label(quantize: str) -> str:
    """What Info reports as the dtype of an ONNX model (the variant is in its runtime report)."""
    return "int8" if quantize in cpuclass.INT8_VARIANTS else "float32"


def load(
    kind: str, backend: str, source: Source, *, quantize: str, cache_dir: Path, threads: int, device: str
) -> tuple[OnnxModel, RuntimeReport]:
    """The ONNX model of `source`: found, or exported (in a child process) and cached; an
    int8 export that failed its check, or was never checked, gives way to float32."""
    cpu = cpuclass.detect()
    directory, manifest = _located(kind, backend, source, quantize, cache_dir, threads)
    check, note = None, ""
    if quantize in cpuclass.INT8_VARIANTS:
        check = QuantizationCheck.from_manifest(manifest.get("check"))
        refusal = _refusal(manifest, check, cpu)
        if refusal:
            note = f"the {quantize} export {refusal}: serving float32"
            log.warning("%s (%s)", note, directory)
            quantize = "none"
            directory, manifest = _located(kind, backend, source, quantize, cache_dir, threads)
    log.info("ONNX model %s (%s, %s, %d threads)", directory, VARIANT_DIR[quantize], cpu, threads)
    model = OnnxModel(directory, manifest, open_session(directory, threads=threads, device=device))
    return model, RuntimeReport(cpu, quantize, check, note)


def _located(
    kind: str, backend: str, source: Source, quantize: str, cache_dir: Path, threads: int
) -> tuple[Path, dict[str, Any]]:
    directory = locate_or_export(
        kind, backend, source, quantize=quantize, cache_dir=cache_dir, threads=threads
    )
    manifest = read_manifest(directory)
    if not manifest_matches(manifest, kind, backend, quantize):
        raise StartupError(f"{directory} holds no {kind} {backend} export ({VARIANT_DIR[quantize]})")
    assert manifest is not None
    return directory, manifest


def _refusal(manifest: Mapping[str, Any], check: QuantizationCheck | None, cpu: str) -> str:
    """Why an int8 export must not be served on `cpu`, or ''."""
    if not cpuclass.runs_exactly(str(manifest.get("quantize")), cpu):
        return f"has 8-bit weights, whose sums saturate this CPU's ({cpu}) int8 kernels"
    if check is None:
        return "was never checked against float32"
    if not check.passed:
        return f"failed its check against float32 ({check.failure}; {check.summary()})"
    return ""
