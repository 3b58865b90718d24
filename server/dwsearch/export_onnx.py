"""`dwsearch export-onnx`: export a model directory to ONNX once — into an image, a volume
or the model directory — so the embedder or reranker starts without exporting. The
services run the same command in a child process on first start when no export exists
(dwsearch.modelserver.onnxexport)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dwsearch.common.errors import StartupError
from dwsearch.modelserver import onnxexport

log = logging.getLogger(__name__)

KINDS = ("embedder", "reranker")


@dataclass(frozen=True)
class Request:
    model: str
    kind: str = "embedder"
    backend: str = "auto"
    quantize: str = "int8"
    output: Path | None = None  # None: the cache entry the services look up
    cache_dir: Path | None = None
    model_id: str = ""
    threads: int = 1  # resolved


def spec_for(kind: str, backend: str, path: Path) -> onnxexport.ExportSpec:
    """The export of `path` by the backend a service with these settings would run."""
    if kind == "reranker":
        from dwsearch_reranker.backends.cross_encoder import CrossEncoderBackend

        if backend not in ("auto", CrossEncoderBackend.name):
            raise StartupError(f"the reranker's backend is {CrossEncoderBackend.name}, not {backend}")
        return CrossEncoderBackend.export_spec(path)
    if kind != "embedder":
        raise StartupError(f"unknown kind {kind!r}: expected {' or '.join(KINDS)}")
    from dwsearch_embedder.backends import backend_name
    from dwsearch_embedder.backends.bge_m3 import BgeM3Backend
    from dwsearch_embedder.backends.sentence_transformers import SentenceTransformersBackend

    name = backend_name(str(path), backend)
    if name == BgeM3Backend.name:
        return BgeM3Backend.export_spec(path)
    if name == SentenceTransformersBackend.name:
        return SentenceTransformersBackend.export_spec(path)
    raise StartupError(f"the {name} backend runs its own engine; it has no ONNX export")


def export(request: Request) -> tuple[Path, dict[str, Any], bool]:
    """Export as `request` says: (directory, manifest, whether it was exported now rather
    than found up to date)."""
    from dwsearch.modelserver import cpuclass
    from dwsearch.modelserver.modelfiles import resolve_model
    from dwsearch.modelserver.threads import apply_torch_threads

    if request.quantize not in ("none", *cpuclass.INT8_VARIANTS):
        raise StartupError(f"quantize must be none, int8 or int8-7bit, not {request.quantize!r}")
    # int8 is this CPU class's variant: the export is checked on the CPU that makes it.
    quantize = (
        cpuclass.int8_variant(cpuclass.detect()) if request.quantize == cpuclass.INT8 else request.quantize
    )
    path = Path(request.model).expanduser()
    if not path.is_dir():
        raise StartupError(
            f"model directory {request.model} does not exist (export-onnx reads a local directory)"
        )
    resolved = resolve_model(str(path), request.model_id)
    source = onnxexport.Source.of(resolved.path, resolved.model_id, resolved.revision)
    spec = spec_for(request.kind, request.backend, resolved.path)
    output = request.output or onnxexport.cache_entry(
        request.cache_dir or onnxexport.default_cache_dir(), source, spec.kind, spec.backend, quantize
    )
    existing = onnxexport.read_manifest(output)
    if existing is not None:
        wanted = (spec.kind, spec.backend, quantize, source.fingerprint)
        found = tuple(existing.get(key) for key in ("kind", "backend", "quantize", "fingerprint"))
        if found != wanted:
            raise StartupError(
                f"{output} already holds another export ({', '.join(map(str, found))}); remove it or choose another --output"
            )
        return output, existing, False
    apply_torch_threads(request.threads)
    manifests: list[dict[str, Any]] = []

    def write(temporary: Path) -> None:
        try:
            manifests.append(onnxexport.export(spec, temporary, quantize=quantize, source=source.describe()))
        except (StartupError, OSError):
            raise
        except Exception as exc:  # torch.onnx, onnx and onnxruntime.quantization raise their own types
            raise StartupError(f"cannot export {resolved.path} to ONNX: {type(exc).__name__}: {exc}") from exc

    onnxexport.export_atomically(output, write)
    manifest = manifests[0] if manifests else onnxexport.read_manifest(output)  # another process may have won
    assert manifest is not None
    return output, manifest, bool(manifests)
