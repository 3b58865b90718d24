"""ONNX Runtime sessions over an exported model (dwsearch.modelserver.onnxexport): the
session options and providers, the loaded model, and the numpy feeds the backends give it
(right-padded ids and their mask, L2-normalized rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dwsearch.common.errors import StartupError

if TYPE_CHECKING:
    import onnxruntime

MODEL_FILE = "model.onnx"


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
