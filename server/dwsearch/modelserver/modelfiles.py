"""What the model services (`dwsearch embedder`, `dwsearch reranker`) share about running a
model: where its files are, what it is called, which revision it is, the device and dtype
it runs on, and the settings and first load steps of a Hugging Face model run on torch or
ONNX Runtime (HubModel).

Model identity (reported by Info; callers compare it before writing vectors):
- a hub id (`BAAI/bge-m3`) is its own model id; its revision is the commit of the cached
  snapshot. Files come from the Hugging Face cache; with HF_HUB_OFFLINE=1 nothing is
  downloaded and a model missing from the cache is a start-up error.
- a local directory inside a Hugging Face cache (`…/models--BAAI--bge-m3/snapshots/<commit>`)
  is that repo id at that commit.
- any other local directory is named by its directory name (mounting bge-m3 at
  `/models/bge-m3` gives `bge-m3`), and its revision is `sha256:` + the first 16 hex
  digits of the weights file's SHA-256.
An explicit model id in the configuration overrides the derived one.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

from dwsearch.common.errors import StartupError
from dwsearch.modelserver import onnxexport, onnxload, onnxsession
from dwsearch.modelserver.quantcheck import RuntimeReport
from dwsearch.modelserver.threads import apply_torch_threads

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Weights files in the order transformers prefers them; the first present is hashed.
WEIGHTS_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
# Formats we never load: fetching them would only cost disk and time.
IGNORED_DOWNLOADS = ["flax_model.msgpack", "rust_model.ot", "tf_model.h5", "onnx/*", "*.onnx", "openvino/*"]
_SNAPSHOT = re.compile(r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})")
_HASH_CHUNK = 16 * 1024 * 1024


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    model_id: str
    revision: str


def resolve_model(spec: str, model_id: str = "") -> ResolvedModel:
    """Local files, identity and revision of `spec` (a hub id or a directory)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path.resolve()
        snapshot = _SNAPSHOT.search(path.as_posix())
        if snapshot:
            derived = f"{snapshot['owner']}/{snapshot['name']}"
            return ResolvedModel(path, model_id or derived, snapshot["commit"])
        return ResolvedModel(path, model_id or path.name, weights_revision(path))
    if path.is_absolute() or spec.startswith("."):
        raise StartupError(f"model directory {spec} does not exist")
    return _from_hub(spec, model_id)


def _from_hub(repo_id: str, model_id: str) -> ResolvedModel:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = constants.HF_HUB_OFFLINE
    try:
        local = Path(snapshot_download(repo_id, local_files_only=offline, ignore_patterns=IGNORED_DOWNLOADS))
    except LocalEntryNotFoundError:
        raise StartupError(
            f"model {repo_id} is not in the Hugging Face cache ({constants.HF_HUB_CACHE})"
            + (" and HF_HUB_OFFLINE=1 forbids downloading it" if offline else " and could not be downloaded")
            + "; mount its files and set the model to that directory"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise StartupError(f"cannot fetch model {repo_id}: {exc}") from None
    snapshot = _SNAPSHOT.search(local.as_posix())
    revision = snapshot["commit"] if snapshot else weights_revision(local)
    return ResolvedModel(local, model_id or repo_id, revision)


def weights_revision(directory: Path) -> str:
    """`sha256:<16 hex>` of the directory's weights file, or '' when it has none."""
    for name in WEIGHTS_FILES:
        candidate = directory / name
        if candidate.is_file():
            return file_revision(candidate)
    return ""


def file_revision(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()[:16]


def resolve_device(setting: str) -> str:
    """`auto` → cuda when a GPU is visible, else cpu; explicit settings are checked."""
    import torch

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise StartupError(f"device {setting} requested but no CUDA device is visible")
    try:
        torch.device(setting)
    except RuntimeError as exc:
        raise StartupError(f"invalid device {setting!r}: {exc}") from None
    return setting


DTYPES = ("float16", "bfloat16", "float32")


def resolve_dtype(setting: str, device: str) -> torch.dtype:
    """`auto` → float16 on a GPU (the speed is worth the last digits), float32 on CPU
    (where float16 is slow and inexact)."""
    import torch

    name = setting
    if setting == "auto":
        name = "float16" if device.startswith("cuda") else "float32"
    if name not in DTYPES:
        raise StartupError(f"invalid dtype {setting!r}: expected auto or one of {', '.join(DTYPES)}")
    dtype: torch.dtype = getattr(torch, name)
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_tokenizer(path: Path) -> Any:
    """The Hugging Face tokenizer saved in `path`, from local files only. Any: transformers
    leaves AutoTokenizer.from_pretrained unannotated, and the backends call the tokenizer
    with their own arguments."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)  # type: ignore[no-untyped-call]  # transformers leaves it unannotated


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and the attention mask that hides the padding, as tensors on
    `device` (onnxsession.pad_ids's arrays)."""
    import torch

    input_ids, mask = onnxsession.pad_ids(sequences, pad_id)
    return torch.from_numpy(input_ids).to(device), torch.from_numpy(mask).to(device)


class Described(TypedDict):
    model_id: str
    revision: str
    device: str
    dtype: str
    runtime: str
    runtime_report: RuntimeReport


@dataclass(frozen=True)
class OpenedModel:
    """A model's files and identity, the device it runs on and the runtime chosen for it."""

    resolved: ResolvedModel
    device: str
    choice: onnxload.RuntimeChoice

    def described(self, dtype: str, report: RuntimeReport | None = None) -> Described:
        """The fields every backend's Info has: identity, device, dtype, runtime and how it
        computes (`report`: the ONNX model's; torch's otherwise)."""
        return {
            "model_id": self.resolved.model_id,
            "revision": self.resolved.revision,
            "device": self.device,
            "dtype": dtype,
            "runtime": self.choice.runtime,
            "runtime_report": report or RuntimeReport(self.choice.cpu_class, "none"),
        }


class HubModel:
    """The settings of a backend that runs a Hugging Face model on torch or ONNX Runtime
    (bge-m3, sentence-transformers, the reranker's cross-encoder), and the load steps they
    share: resolve the files, the device and the runtime, size torch's thread pool, and
    load (exporting on first use) the ONNX graph."""

    name: ClassVar[str]
    service: ClassVar[str]  # "embedder" | "reranker": the kind of ONNX export

    def __init__(
        self,
        spec: str,
        *,
        model_id: str = "",
        device: str = "auto",
        dtype: str = "auto",
        threads: int = 1,
        runtime: str = "torch",
        quantize: str = "none",
        onnx_cache_dir: Path | None = None,
    ) -> None:
        self._spec = spec
        self._model_id = model_id
        self._device_setting = device
        self._dtype_setting = dtype
        self._threads = threads
        self._runtime_setting = runtime
        self._quantize_setting = quantize
        self._onnx_cache_dir = onnx_cache_dir
        self._onnx: onnxsession.OnnxModel | None = None
        self._device = "cpu"

    def _open(self) -> OpenedModel:
        resolved = resolve_model(self._spec, self._model_id)
        device = resolve_device(self._device_setting)
        choice = onnxload.choose_runtime(
            self._runtime_setting, self._quantize_setting, device=device, dtype=self._dtype_setting
        )
        apply_torch_threads(self._threads)  # torch runs the model, or traces it for the export
        self._device = device
        return OpenedModel(resolved, device, choice)

    def _load_onnx(self, opened: OpenedModel) -> tuple[onnxsession.OnnxModel, RuntimeReport]:
        """The ONNX model and how it computes (float32 when the int8 export was refused)."""
        resolved = opened.resolved
        self._onnx, report = onnxload.load(
            self.service,
            self.name,
            onnxexport.Source.of(resolved.path, resolved.model_id, resolved.revision),
            quantize=opened.choice.quantize,
            cache_dir=self._onnx_cache_dir or onnxexport.default_cache_dir(),
            threads=self._threads,
            device=opened.device,
        )
        return self._onnx, report
