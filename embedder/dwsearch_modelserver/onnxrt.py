"""ONNX Runtime for the model services: choosing the runtime, exporting a model's graph
once, caching it, and running it.

Runtime (`DWSEARCH_EMBED_RUNTIME`, shared by the embedder and the reranker):
- `auto`: ONNX Runtime on CPU (full-size bge-m3 on 2 cores: a 16-token query 2.2x, int8
  5x faster than torch; bench/results/onnx_fullsize.json), torch on a GPU (float16; ONNX
  Runtime's CUDA provider is unmeasured), and torch when a float16 / bfloat16 dtype is set;
- `torch` / `onnx`: that one; `onnx` on a GPU needs onnxruntime-gpu's CUDA provider.
Quantization (`DWSEARCH_QUANTIZE`): `int8` is ONNX Runtime's dynamic quantization (int8
weights per output channel, activations quantized per batch), CPU only, in the variant
whose sums are exact on this CPU class (dwsearch_modelserver.cpuclass: 8-bit weights with VNNI
or on ARM64, 7-bit ones elsewhere); `int8-7bit` asks for 7-bit weights on any CPU; `auto`
= the class's int8 with ONNX Runtime on a CPU class where int8 was measured both accurate
and faster than float32 (AUTO_INT8_CLASSES), none otherwise.

Every int8 export is checked against its float32 graph on the shipped probe set when it is
made (dwsearch_modelserver.quantcheck), and the check goes into its manifest with the CPU
class it was made on. An export that failed is never served: the service loads (or
exports) float32 instead and says why in Info, its log and a metric. An export whose
8-bit sums would saturate this CPU's kernels is never loaded either.

An exported model is a directory: `model.onnx` (weights over 2 GB in `model.onnx.data`
beside it, as ONNX's protobuf cannot hold them), `dwsearch-onnx.json` (what it is: kind,
backend, source model, revision and fingerprint, quantization, inputs, outputs, backend
extras) and, where the backend needs it, the tokenizer. It is found, in order:
1. in the model directory: `onnx/` or `onnx/<fp32|int8>/` holding a matching manifest of
   the same fingerprint (what `dwsearch export-onnx --output MODEL/onnx/int8` writes; ONNX
   files exported by other tools have other outputs and are ignored);
2. in the cache (`DWSEARCH_ONNX_CACHE_DIR`), keyed by kind, backend, quantization (the
   variant: int8 or int8-7bit) and the model's fingerprint (its revision plus its small
   files: configs, heads);
3. else exported into the cache on the spot by `dwsearch export-onnx` in a child process:
   written to a temporary directory and renamed into place under a file lock, so two
   processes starting at once export once and a crash never leaves a half-written model.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dwsearch.common.config import default_onnx_cache_dir
from dwsearch.common.errors import StartupError
from dwsearch_modelserver import cpuclass
from dwsearch_modelserver.quantcheck import Probed, QuantizationCheck, RuntimeReport, compare
from dwsearch_modelserver.threads import THREAD_ENV_VARS

if TYPE_CHECKING:
    import onnxruntime
    import torch

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "onnx")
QUANTIZATIONS = ("auto", "none", cpuclass.INT8, cpuclass.INT8_7BIT)
# CPU classes where `quantize=auto` picks int8 with ONNX Runtime: measured there both as
# accurate as float32 (the guard's thresholds) and faster (docs/operations.md, "CPU classes").
# On the others int8 is unmeasured and `auto` keeps float32; `int8` opts in, checked.
AUTO_INT8_CLASSES = frozenset({cpuclass.X86_VNNI, cpuclass.X86_AVX2})
# 2: int8 exports carry their variant, CPU class and check; format 1's (unchecked 8-bit
# weights) are exported again.
FORMAT = 2
MANIFEST = "dwsearch-onnx.json"
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
OPSET = 17
# Files up to this size in a model directory (configs, heads, tokenizer configs) are
# fingerprinted into the cache key: a changed sparse head or pooling config is a new export.
_FINGERPRINT_MAX_BYTES = 1_000_000
VARIANT_DIR = {"none": "fp32", cpuclass.INT8: "int8", cpuclass.INT8_7BIT: "int8-7bit"}
_PAGE = 4096  # external data offsets aligned, so ONNX Runtime can map them


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


def default_cache_dir() -> Path:
    return default_onnx_cache_dir()


def dtype_label(quantize: str) -> str:
    """What Info reports as the dtype of an ONNX model (the variant is in its runtime report)."""
    return "int8" if quantize in cpuclass.INT8_VARIANTS else "float32"


# --- sessions ------------------------------------------------------------------------------


def session_options(threads: int) -> onnxruntime.SessionOptions:
    """One intra-op pool of `threads`, no inter-op parallelism, no spinning (spinning
    threads burn the CPU quota other work on a small or shared box needs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: constant-folding notes are noise
    return options


def providers(device: str) -> list[Any]:
    import onnxruntime as ort

    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise StartupError(
                f"device {device} with the onnx runtime needs onnxruntime-gpu (CUDAExecutionProvider); "
                f"this onnxruntime has {', '.join(ort.get_available_providers())}. Use the torch runtime on GPU"
            )
        index = int(device.partition(":")[2] or 0)
        return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    raise StartupError(f"the onnx runtime runs on cpu or cuda, not {device}")


@dataclass
class OnnxModel:
    """A loaded exported model: its directory, manifest and session."""

    directory: Path
    manifest: dict[str, Any]
    session: onnxruntime.InferenceSession
    input_names: tuple[str, ...] = field(init=False)
    output_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_names = tuple(o.name for o in self.session.get_outputs())

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.session.run(None, {name: feeds[name] for name in self.input_names})
        return dict(zip(self.output_names, outputs, strict=True))


def open_session(directory: Path, *, threads: int, device: str) -> onnxruntime.InferenceSession:
    import onnxruntime as ort

    path = directory / MODEL_FILE
    try:
        return ort.InferenceSession(
            str(path), sess_options=session_options(threads), providers=providers(device)
        )
    except StartupError:
        raise
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, …)
        raise StartupError(f"cannot load the ONNX model {path}: {exc}") from None


def pad_ids(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded int64 ids and the attention mask that hides the padding (numpy)."""
    longest = max(len(ids) for ids in sequences)
    input_ids = np.full((len(sequences), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), longest), dtype=np.int64)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = ids
        mask[row, : len(ids)] = 1
    return input_ids, mask


def l2_normalize_rows(vectors: np.ndarray, rows: Sequence[bool]) -> np.ndarray:
    """Rows flagged in `rows` divided by their norm (as torch.nn.functional.normalize:
    eps 1e-12); the others unchanged."""
    if not any(rows):
        return vectors
    norms = np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return np.where(np.asarray(rows)[:, None], vectors / norms, vectors).astype(np.float32, copy=False)


# --- export ------------------------------------------------------------------------------------


@dataclass
class ExportGraph:
    """A torch module to trace (float32, CPU, eval), example inputs (a padded batch, so the
    traced graph masks padding), extras for the manifest, and the tokenizer to save beside
    the graph for backends that read their own copy."""

    module: torch.nn.Module | None  # None once traced: the weights are freed before quantizing
    inputs: dict[str, torch.Tensor]
    extras: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None


@dataclass(frozen=True)
class ExportSpec:
    """What a backend exports; `build` loads the torch model (only when an export is needed);
    `probe` runs the probe set through an exported graph (an OnnxModel whose manifest holds
    the graph's extras) the way the backend serves it, for the int8 check."""

    kind: str  # "embedder" | "reranker"
    backend: str  # the backend's name
    build: Callable[[], ExportGraph]
    outputs: dict[str, dict[int, str]]  # output name → its dynamic axes
    probe: Callable[[OnnxModel], Probed] | None = None


def export(spec: ExportSpec, output: Path, *, quantize: str, source: Mapping[str, str]) -> dict[str, Any]:
    """Export `spec` into the empty or missing directory `output`, in this process (not
    atomic: see `export_atomically`), and return the manifest written."""
    import onnx
    import torch
    from torch.jit._trace import TracerWarning  # torch.jit re-exports it without declaring it

    output.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    built = spec.build()
    module, inputs, extras = built.module, built.inputs, built.extras
    if module is None:
        raise ValueError("the export graph's module was already traced")
    work = Path(tempfile.mkdtemp(prefix="export-", dir=output))
    try:
        traced = work / MODEL_FILE
        dynamic_axes = {name: {0: "batch", 1: "sequence"} for name in inputs}
        dynamic_axes.update(spec.outputs)
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            # The tracer warns of Python values it records as constants: here the checks
            # transformers and sentence-transformers make that hold for any batch.
            warnings.simplefilter("ignore", TracerWarning)
            warnings.simplefilter(
                "ignore", DeprecationWarning
            )  # dynamo=False is the legacy exporter, on purpose
            torch.onnx.export(
                module,
                tuple(inputs.values()),
                str(traced),
                input_names=list(inputs),
                output_names=list(spec.outputs),
                dynamic_axes=dynamic_axes,
                opset_version=OPSET,
                dynamo=False,
                do_constant_folding=True,
            )
        parameters = sum(p.numel() for p in module.parameters())
        del module  # free the torch weights before quantizing
        built.module = None
        fp32 = output / MODEL_FILE if quantize == "none" else work / "fp32" / MODEL_FILE
        _gather_external_data(traced, fp32)
        check = None
        if quantize in cpuclass.INT8_VARIANTS:
            _quantize_int8(fp32, output / MODEL_FILE, weight_bits=cpuclass.WEIGHT_BITS[quantize])
            if spec.probe is not None:
                check = check_quantized(spec.probe, fp32.parent, output, extras)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if built.tokenizer is not None:
        built.tokenizer.save_pretrained(str(output))
    import onnxruntime

    manifest = {
        "format": FORMAT,
        "kind": spec.kind,
        "backend": spec.backend,
        "quantize": quantize,
        "cpu_class": cpuclass.detect(),
        **{key: value for key, value in source.items()},
        "inputs": list(inputs),
        "outputs": list(spec.outputs),
        "parameters": parameters,
        "opset": OPSET,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "export_seconds": round(time.monotonic() - started, 1),
        "bytes": sum(f.stat().st_size for f in output.iterdir() if f.is_file()),
        **extras,
    }
    if quantize in cpuclass.INT8_VARIANTS:
        manifest["weight_bits"] = cpuclass.WEIGHT_BITS[quantize]
        manifest["check"] = check.to_manifest() if check is not None else None
    (output / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_quantized(
    probe: Callable[[OnnxModel], Probed], fp32: Path, int8: Path, extras: Mapping[str, Any]
) -> QuantizationCheck:
    """The int8 graph in `int8` against the float32 one in `fp32` on the probe set, on this CPU."""
    threads = max(1, min(2, os.cpu_count() or 1))
    started = time.monotonic()
    outputs = []
    for directory in (fp32, int8):
        model = OnnxModel(directory, dict(extras), open_session(directory, threads=threads, device="cpu"))
        outputs.append(probe(model))
        del model
    check = compare(outputs[0], outputs[1], cpu_class=cpuclass.detect())
    log.info(
        "int8 check %s in %.1f s: %s%s",
        "passed" if check.passed else "FAILED", time.monotonic() - started, check.summary(),
        f" ({check.failure})" if check.failure else "",
    )  # fmt: skip
    return check


def _gather_external_data(source: Path, target: Path) -> None:
    """Save the graph at `source` as `target`. The TorchScript exporter writes each tensor
    of a model over 2 GB to a file of its own; those are copied one at a time into one
    page-aligned `model.onnx.data` beside `target` (never all in memory at once). A small
    model has its weights inside the graph and is copied as it is."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    target.parent.mkdir(parents=True, exist_ok=True)
    graph = onnx.load(str(source), load_external_data=False)
    tensors = [t for t in _initializers(graph) if uses_external_data(t)]
    if not tensors:
        shutil.copyfile(source, target)
        return
    with open(target.parent / DATA_FILE, "wb") as data:
        for tensor in tensors:
            _write_external(tensor, _read_external(tensor, source.parent), data)
    onnx.save_model(graph, str(target))


def _initializers(graph: Any) -> Iterator[Any]:
    """Every initializer of the model, subgraphs included."""
    from onnx.external_data_helper import _get_all_tensors

    return iter(_get_all_tensors(graph))


def _quantize_int8(fp32: Path, output: Path, *, weight_bits: int = 8) -> None:
    """Dynamic int8 quantization, one tensor at a time, with weights in `weight_bits` bits
    (8, or 7 for CPUs whose u8×s8 sums saturate: dwsearch_modelserver.cpuclass).

    Each MatMul by a constant 2-D weight becomes com.microsoft's DynamicQuantizeMatMul
    over the weight in int8, symmetric per output column (activations are quantized per
    batch at run time); each Gather from a constant table (the embeddings) reads a uint8
    table, asymmetric per tensor, through DequantizeLinear. That is the graph ONNX Runtime
    runs after fusing what onnxruntime.quantization.quantize_dynamic(per_channel=True,
    weight_type=QInt8) writes, as close to float32 (all-MiniLM-L6-v2 on the support set:
    cosine 0.988 lowest, 0.994 mean, for both) — but quantize_dynamic holds several copies
    of the model, 8.5 GB for bge-m3, over the embedder pods' memory limit, where this holds
    one tensor at a time. Per-tensor weight scales would cost MiniLM a cosine of 0.966 to
    its float32 vectors (tests/embedder/test_onnx_runtime.py checks per-column's)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(fp32), load_external_data=False)
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    consumers: dict[str, set[tuple[str, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, set()).add((node.op_type, index))
    external = any(uses_external_data(tensor) for tensor in graph.initializer)

    def read(tensor: Any) -> np.ndarray:
        if not uses_external_data(tensor):
            return numpy_helper.to_array(tensor)
        raw = _read_external(tensor, fp32.parent)
        return np.frombuffer(raw, dtype=helper.tensor_dtype_to_np_dtype(tensor.data_type)).reshape(
            tuple(tensor.dims)
        )

    def constant_2d(name: str, op: str, index: int) -> bool:
        tensor = weights.get(name)
        return (
            tensor is not None
            and tensor.data_type == TensorProto.FLOAT
            and len(tensor.dims) == 2
            and consumers[name] == {(op, index)}
        )

    levels = (1 << (weight_bits - 1)) - 1  # 127 or 63: symmetric, zero point 0
    with contextlib.ExitStack() as stack:
        data = stack.enter_context(open(output.parent / DATA_FILE, "wb")) if external else None

        def store(array: np.ndarray, name: str) -> Any:
            if data is None or array.nbytes < 1024:
                return numpy_helper.from_array(array, name)
            tensor = TensorProto(
                name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape
            )
            _write_external(tensor, array.tobytes(), data)
            return tensor

        quantized: dict[str, tuple[str, ...]] = {}
        added: list[Any] = []
        nodes: list[Any] = []
        for node in graph.node:
            if node.op_type == "MatMul" and constant_2d(node.input[1], "MatMul", 1):
                name = node.input[1]
                if name not in quantized:
                    weight = read(weights[name])
                    scale = _scale(np.abs(weight).max(axis=0), levels)
                    added += [
                        store(_to_int8(weight, scale, levels), name + "_int8"),
                        store(scale, name + "_scale"),
                    ]
                    quantized[name] = (name + "_int8", name + "_scale")
                    del weight
                nodes.append(helper.make_node(
                    "DynamicQuantizeMatMul", [node.input[0], *quantized[name]], list(node.output),
                    name=node.name + "_int8", domain="com.microsoft",
                ))  # fmt: skip
            elif node.op_type == "Gather" and constant_2d(node.input[0], "Gather", 0):
                name = node.input[0]
                if name not in quantized:
                    table = read(weights[name])
                    low, high = min(float(table.min()), 0.0), max(float(table.max()), 0.0)
                    table_scale = np.float32((high - low) / 255 or 1.0)
                    zero_point = np.uint8(round(float(-low / table_scale)))
                    added += [
                        store(_to_uint8(table, table_scale, zero_point), name + "_int8"),
                        store(np.asarray(table_scale), name + "_scale"),
                        store(np.asarray(zero_point), name + "_zero_point"),
                    ]
                    quantized[name] = (name + "_int8", name + "_scale", name + "_zero_point")
                    del table
                gather = onnx.NodeProto()
                gather.CopyFrom(node)
                gather.input[0] = quantized[name][0]
                gather.output[0] = node.output[0] + "_int8"
                nodes += [gather, helper.make_node(
                    "DequantizeLinear", [gather.output[0], *quantized[name][1:]], [node.output[0]],
                    name=node.name + "_dequantize",
                )]  # fmt: skip
            else:
                nodes.append(node)
        used = {name for node in nodes for name in node.input}
        kept = [tensor for tensor in graph.initializer if tensor.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        del graph.node[:]
        graph.node.extend(nodes)
        if data is not None:  # what stays float32 (initializers, Constant nodes) moves to the new file too
            for tensor in _initializers(model):
                if uses_external_data(tensor):
                    _write_external(tensor, _read_external(tensor, fp32.parent), data)
        graph.initializer.extend(added)
    if not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save_model(model, str(output))


def _scale(absmax: np.ndarray, levels: int = 127) -> np.ndarray:
    return np.where(absmax > 0, absmax / levels, 1).astype(np.float32)


def _to_int8(weight: np.ndarray, scale: np.ndarray, levels: int = 127, rows: int = 16384) -> np.ndarray:
    """round(weight / scale) in [-levels, levels], a block of rows at a time (the embedding
    table of bge-m3 is 1 GB in float32)."""
    out = np.empty(weight.shape, dtype=np.int8)
    for start in range(0, weight.shape[0], rows):
        block = weight[start : start + rows] / scale
        out[start : start + rows] = np.clip(np.rint(block), -levels, levels)
    return out


def _to_uint8(table: np.ndarray, scale: np.float32, zero_point: np.uint8, rows: int = 16384) -> np.ndarray:
    """Asymmetric per-tensor uint8 (as quantize_dynamic stores a Gather's table), a block
    of rows at a time."""
    out = np.empty(table.shape, dtype=np.uint8)
    for start in range(0, table.shape[0], rows):
        block = np.rint(table[start : start + rows] / scale) + int(zero_point)
        out[start : start + rows] = np.clip(block, 0, 255)
    return out


def _read_external(tensor: Any, directory: Path) -> bytes:
    from onnx.external_data_helper import ExternalDataInfo

    info = ExternalDataInfo(tensor)
    with open(directory / info.location, "rb") as blob:
        blob.seek(info.offset or 0)
        return blob.read(info.length) if info.length else blob.read()


def _write_external(tensor: Any, content: bytes, data: Any) -> None:
    """Append `content` to the open data file, page-aligned, and point `tensor` at it."""
    from onnx import TensorProto

    offset = -data.tell() % _PAGE + data.tell()
    data.seek(offset)
    data.write(content)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", DATA_FILE), ("offset", offset), ("length", len(content))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)


# --- finding, caching ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """The model an export comes from: its directory, the id and revision Info reports, and
    a fingerprint of the files the export depends on."""

    path: Path
    model_id: str
    revision: str
    fingerprint: str

    @classmethod
    def of(cls, path: Path, model_id: str, revision: str) -> Source:
        """The fingerprint is the revision (hub commit or weights hash) plus a hash of the
        small files beside the weights (configs, heads, pooling), 12 hex digits."""
        digest = hashlib.sha256(revision.encode())
        for file in sorted(path.rglob("*")):
            relative = file.relative_to(path)
            if relative.parts[0] in ("onnx", ".cache") or not file.is_file():
                continue
            if file.stat().st_size <= _FINGERPRINT_MAX_BYTES:
                digest.update(relative.as_posix().encode() + b"\0" + file.read_bytes())
        return cls(path, model_id, revision, digest.hexdigest()[:12])

    def describe(self) -> dict[str, str]:
        return {"model_id": self.model_id, "revision": self.revision, "fingerprint": self.fingerprint}


def read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != FORMAT
        or not (directory / MODEL_FILE).is_file()
    ):
        return None
    return manifest


def _matches(manifest: dict[str, Any] | None, kind: str, backend: str, quantize: str) -> bool:
    return (
        manifest is not None
        and manifest.get("kind") == kind
        and manifest.get("backend") == backend
        and manifest.get("quantize") == quantize
    )


def in_model_dir(source: Source, kind: str, backend: str, quantize: str) -> Path | None:
    """An export already in the model directory (`onnx/` or `onnx/<fp32|int8|int8-7bit>/`)."""
    if quantize in cpuclass.INT8_VARIANTS:
        _explain_saturating(source, quantize)
    for candidate in (source.path / "onnx", source.path / "onnx" / VARIANT_DIR[quantize]):
        manifest = read_manifest(candidate)
        if not _matches(manifest, kind, backend, quantize):
            continue
        assert manifest is not None
        if manifest.get("fingerprint") != source.fingerprint:
            log.warning(
                "ignoring %s: exported from another revision of the model (%s, now %s)",
                candidate, manifest.get("revision"), source.revision,
            )  # fmt: skip
            continue
        return candidate
    if (source.path / "onnx" / MODEL_FILE).is_file() and read_manifest(source.path / "onnx") is None:
        log.info(
            "ignoring %s: not exported by dwsearch (its outputs differ)", source.path / "onnx" / MODEL_FILE
        )
    return None


def _explain_saturating(source: Source, quantize: str) -> None:
    """Say so when the model directory holds an int8 export this CPU must not run."""
    root = source.path / "onnx"
    cpu = cpuclass.detect()
    for candidate in (root, *(root / VARIANT_DIR[v] for v in cpuclass.INT8_VARIANTS)):
        manifest = read_manifest(candidate)
        if manifest is not None and not cpuclass.runs_exactly(str(manifest.get("quantize")), cpu):
            log.warning(
                "ignoring %s: its 8-bit int8 weights (exported on %s) saturate this CPU's (%s) int8 "
                "kernels; using the %s variant",
                candidate, manifest.get("cpu_class", "an unrecorded CPU"), cpu, quantize,
            )  # fmt: skip


_SNAPSHOT = re.compile(r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)/snapshots/")


def cache_entry(cache_dir: Path, source: Source, kind: str, backend: str, quantize: str) -> Path:
    """`<cache>/<model>/<kind>-<backend>-<fp32|int8>-<fingerprint>`, where <model> is the hub
    repo or the directory's name (for people; the fingerprint is what tells models apart)."""
    snapshot = _SNAPSHOT.search(source.path.as_posix())
    name = f"{snapshot['owner']}--{snapshot['name']}" if snapshot else source.path.name
    variant = f"{kind}-{backend}-{VARIANT_DIR[quantize]}-{source.fingerprint}"
    return cache_dir / _slug(name) / _slug(variant)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "model"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def export_atomically(entry: Path, write: Callable[[Path], None]) -> Path:
    """`entry` holding an export: already there, or written now by `write` into a temporary
    sibling and renamed into place. A file lock makes concurrent starts export once; a
    crashed export leaves only a temporary directory, removed by the next export."""
    if read_manifest(entry) is not None:
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _locked(entry.parent / f".{entry.name}.lock"):
        if read_manifest(entry) is not None:  # another process exported it while we waited
            return entry
        for stale in entry.parent.glob(f".{entry.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if _outdated(entry):  # ours, of an older format: exported again in its place
            log.info("replacing %s: exported by an older dwsearch (format %s)", entry, FORMAT)
            shutil.rmtree(entry)
        if entry.exists():
            if any(entry.iterdir()):  # not written by a rename: never delete what may be someone's files
                raise StartupError(
                    f"{entry} exists and holds no dwsearch export; remove it or export elsewhere"
                )
            entry.rmdir()
        temporary = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
        try:
            write(temporary)
            if read_manifest(temporary) is None:
                raise StartupError(f"the export into {temporary} left no {MANIFEST}")
            temporary.chmod(0o755)  # mkdtemp's 0700 would hide it from other users of a shared volume
            os.replace(temporary, entry)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
    return entry


# `dwsearch export-onnx`'s exit code for an export written whose int8 check failed.
EXIT_CHECK_FAILED = 1


def _outdated(entry: Path) -> bool:
    """Whether `entry` holds a dwsearch export of another format (a manifest of ours)."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and "kind" in manifest and manifest.get("format") != FORMAT


def export_in_child(
    kind: str, backend: str, source: Source, quantize: str, output: Path, threads: int
) -> None:
    """Run `dwsearch export-onnx` for `source` into `output` in a child process: tracing
    takes twice the model's size in memory (bge-m3: 5.2 GB at peak), which the child gives
    back when it exits, and a child killed for memory is an error that says so rather
    than the death of the service.
    The child exports atomically under a lock (export_atomically)."""
    command = [
        sys.executable, "-m", "dwsearch.cli", "export-onnx", "--model", str(source.path), "--kind", kind,
        "--backend", backend, "--quantize", quantize, "--output", str(output), "--model-id", source.model_id,
        "--threads", str(threads), "--log-format", "text",
    ]  # fmt: skip
    env = {**os.environ, **{name: str(threads) for name in THREAD_ENV_VARS}}
    log.info("exporting %s to ONNX (%s) into %s", source.model_id, VARIANT_DIR[quantize], output)
    started = time.monotonic()
    done = subprocess.run(
        command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    for line in (done.stdout + done.stderr).splitlines():
        log.debug("export-onnx: %s", line)
    if done.returncode == EXIT_CHECK_FAILED and read_manifest(output) is not None:
        return  # exported, and its int8 check failed: `load` serves float32 and says why
    if done.returncode != 0:
        if done.returncode < 0:
            why = f"was killed by {signal.Signals(-done.returncode).name}"
            if done.returncode == -signal.SIGKILL:
                why += " (out of memory? pre-build it with `dwsearch export-onnx` where memory allows)"
        else:
            why = f"failed (exit {done.returncode}): " + " | ".join(done.stderr.strip().splitlines()[-3:])
        raise StartupError(f"the ONNX export of {source.model_id} {why}")
    log.info("exported %s to ONNX in %.1f s", source.model_id, time.monotonic() - started)


def locate_or_export(
    kind: str, backend: str, source: Source, *, quantize: str, cache_dir: Path, threads: int
) -> Path:
    """The directory of the export of `source` (see the module docstring)."""
    directory = in_model_dir(source, kind, backend, quantize)
    if directory is not None:
        return directory
    entry = cache_entry(cache_dir, source, kind, backend, quantize)
    if read_manifest(entry) is None:
        export_in_child(kind, backend, source, quantize, entry, threads)
    return entry


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
    if not _matches(manifest, kind, backend, quantize):
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
