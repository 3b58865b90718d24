"""Exporting a model's graph to ONNX once and caching it: the export (traced in torch,
quantized to int8 by dwsearch.modelserver.quantizer and checked against its float32 graph
on the shipped probe set, dwsearch.modelserver.quantcheck), its manifest, the cache and its
lock, and the export a service makes in a child process on first start.

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dwsearch.common.config import default_onnx_cache_dir
from dwsearch.common.errors import StartupError
from dwsearch.modelserver import cpuclass
from dwsearch.modelserver.onnxsession import MODEL_FILE, OnnxModel, open_session
from dwsearch.modelserver.quantcheck import Probed, QuantizationCheck, compare
from dwsearch.modelserver.quantizer import (
    DATA_FILE,
    initializers,
    quantize_int8,
    read_external,
    write_external,
)
from dwsearch.modelserver.threads import THREAD_ENV_VARS

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# 2: int8 exports carry their variant, CPU class and check; format 1's (unchecked 8-bit
# weights) are exported again. 3: int8 activations quantized per row (a text's vector
# does not depend on its batch); format 2's, per batch, are exported again.
FORMAT = 3
MANIFEST = "dwsearch-onnx.json"
OPSET = 17
# Files up to this size in a model directory (configs, heads, tokenizer configs) are
# fingerprinted into the cache key: a changed sparse head or pooling config is a new export.
_FINGERPRINT_MAX_BYTES = 1_000_000
VARIANT_DIR = {"none": "fp32", cpuclass.INT8: "int8", cpuclass.INT8_7BIT: "int8-7bit"}


def default_cache_dir() -> Path:
    return default_onnx_cache_dir()


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
            quantize_int8(fp32, output / MODEL_FILE, weight_bits=cpuclass.WEIGHT_BITS[quantize])
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
    tensors = [t for t in initializers(graph) if uses_external_data(t)]
    if not tensors:
        shutil.copyfile(source, target)
        return
    with open(target.parent / DATA_FILE, "wb") as data:
        for tensor in tensors:
            write_external(tensor, read_external(tensor, source.parent), data)
    onnx.save_model(graph, str(target))


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


def manifest_matches(manifest: dict[str, Any] | None, kind: str, backend: str, quantize: str) -> bool:
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
        if not manifest_matches(manifest, kind, backend, quantize):
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
