"""The embedder against its peers (issue 50): `python -m bench.embedder --sections peers`.

On the full-size bge-m3 shape the bench already builds (random weights, the real
tokenizer: dwsearch_testkit.tiny_models.fullsize_bge_m3_dir), with bench.embedder's texts
(QUERIES one at a time, chat_windows(64) of ~115 tokens in batches of 32) and 2 threads
everywhere, each entry in its own process, one after another (each holds gigabytes):

- dwsearch: `dwsearch embedder` as served (gRPC), with the runtime and quantization it
  chooses for this CPU class (no --embed-runtime / --quantize); dense + sparse.
- torch-fp32: transformers in a process of its own (CLS pooling, normalized, as dwsearch's
  torch path): the fp32 reference every entry's dense cosine is measured against.
- infinity-torch, infinity-optimum: Infinity (`infinity-emb`) serving the same weights over
  its HTTP API (POST /embeddings), engine torch and engine optimum (ONNX Runtime, from an
  fp32 ONNX export by optimum, as Infinity finds one in a model repository), CLS pooling
  as bge-m3 ships it (a sentence-transformers layout beside the same files). Infinity gives
  no sparse vectors. Its optimum engine optimizes the graph on first start, a step that
  fails with optimum-onnx 0.1.0; the bench makes the same optimization where Infinity then
  finds it (infinity_optimize), so the engine runs as Infinity means it to.
- openvino-int8-nncf: OpenVINO's own int8 (nncf.quantize, calibrated on chat windows other
  than the measured ones) of dwsearch's fp32 ONNX export; dense + sparse.
- openvino-bf16: the same fp32 export compiled with INFERENCE_PRECISION_HINT bf16; what
  OpenVINO actually ran is recorded (a CPU without bf16 runs f32).
- torch-bf16-autocast: torch.autocast("cpu", torch.bfloat16) (AMX or AVX-512 BF16 through
  oneDNN where the CPU has them); dense + sparse.

Per entry: query p50 / p99 (batch 1, after warm-up), windows/s (batches of 32; servers get
two concurrent calls, as bench.embedder's fullsize section sends them; in-process entries
one batch after another), dense cosine to the fp32 reference (lowest and mean over the
queries and windows) and whether it is ≥ 0.99 (the guard dwsearch's int8 passes), whether
sparse vectors are given, start seconds (process start to serving, or in-process to the
first answer; one-off preparation — exports, quantization, Infinity's ONNX optimization —
is done before, cached, and its seconds in this run are prepare_s), peak RSS and the CPU
class.
Windows are measured for at most WINDOWS_BUDGET_S per entry (at least one batch).

The limits, measured (issue 50, item 3), for the same CPU class:
- memory_copy_gb_s: a STREAM-like copy with numpy on 2 threads (bytes read + written over
  the time, best of several passes over arrays far larger than the caches);
- query_weight_read_floor_ms: the bytes of weights one query reads from dwsearch's served
  ONNX export (every initializer, except tables read by Gather — the embeddings — of which
  a query reads a few rows) over that bandwidth; query_weight_read_floor_fraction is that
  floor over dwsearch's query p50 (1 = at the memory bound);
- windows_int8_tops: 2 × the encoder's parameters without the embeddings × tokens per
  window × dwsearch's windows/s (the matrix products; attention's own products, ~2% at 115
  tokens, are left out), against an estimated int8 peak for the CPU class: int8 ops per
  cycle per core (INT8_OPS_PER_CYCLE, from the instructions each class's kernels use) ×
  the clock (lscpu's max MHz, else /proc/cpuinfo's) × the threads. An estimate, not a
  measurement: the clock under load and the vCPUs' sharing of a core are unknown.

Peers install with pip into venvs of their own under ~/.cache/dwsearch/bench-peers/
(DWSEARCH_BENCH_PEERS), never into the product's environment. Each sees the product's
packages (a .pth file) and installs under constraints pinning the product's versions of
torch, transformers, numpy and the rest (PINNED_FROM_PRODUCT), so no second torch comes
down; a peer that requires other versions of some of them names them (PeerInstall.unpinned)
and gets its own copies inside its venv. A peer that does not install or start is recorded
as {"skipped": reason} and the others go on.

--quick runs a tiny bge-m3 (2 layers, hidden 32, the real tokenizer and the 8192-token
limit: build_quick_model) on fewer texts: the plumbing, not the speed.

    python -m bench.embedder --sections peers
    DWSEARCH_BENCH_PEERS_ONLY=dwsearch,openvino-int8-nncf python -m bench.embedder --sections peers
    python -m bench.embedder_peers install      # install (or check) the peers only

(DWSEARCH_BENCH_PEERS_ONLY: these entries and the fp32 reference; the others' records are
dropped for this CPU class, so a full run is what the results file should hold.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PEERS_HOME = Path(os.environ.get("DWSEARCH_BENCH_PEERS", Path.home() / ".cache" / "dwsearch" / "bench-peers"))
THREADS = 2
WINDOWS = 64
WINDOWS_PER_CALL = 32
QUERY_COUNT = 20
CALIBRATION_WINDOWS = 64
CALIBRATION_SEED = 11  # bench.embedder.chat_windows measures seed 5: calibrate on other windows
WINDOWS_BUDGET_S = 120.0
QUICK = {"windows": 8, "queries": 8, "calibration": 8, "budget_s": 30.0}
REFERENCE = "torch-fp32"
DWSEARCH = "dwsearch"
# The guard dwsearch's int8 must pass (issue 50: dense cosine to fp32 on the probe set),
# applied here to every entry's lowest cosine on the measured texts (passes_cosine_guard).
COSINE_GUARD = 0.99
THREAD_ENV = {
    "OMP_NUM_THREADS": str(THREADS),
    "MKL_NUM_THREADS": str(THREADS),
    "OPENBLAS_NUM_THREADS": str(THREADS),
    "TOKENIZERS_PARALLELISM": "false",
}
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
}


# --- installing the peers -----------------------------------------------------------------

# Product packages whose installed versions bind every peer's venv (when the peer needs
# them at all): the heavy ones, and those that decide what the model computes.
PINNED_FROM_PRODUCT = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "numpy",
    "scipy",
    "onnx",
    "onnxruntime",
    "sentence-transformers",
    "accelerate",
    "protobuf",
)


@dataclass(frozen=True)
class PeerInstall:
    """A venv of its own: `requirements` (pinned), installed under constraints from the
    product's versions except `unpinned` (packages the peer requires in other versions,
    which it gets inside its venv, shadowing the product's), and `check` (Python that must
    run in the venv once installed)."""

    name: str
    requirements: tuple[str, ...]
    unpinned: tuple[str, ...] = ()
    check: str = ""
    why_unpinned: str = ""


INSTALLS = {
    "openvino": PeerInstall(
        "openvino",
        ("openvino==2026.4.1", "nncf==3.4.0"),
        check="import openvino, nncf; print(openvino.__version__, nncf.__version__)",
    ),
    "infinity": PeerInstall(
        "infinity",
        (
            "infinity-emb[server,torch,optimum]==0.0.78",
            # optimum-onnx 0.1.0 (Infinity's optimum engine) requires optimum ~= 2.1.0.
            "optimum==2.1.0",
            "optimum-onnx[onnxruntime]==0.1.0",
            "numpy==1.26.4",
            "sentence-transformers==3.4.1",
            # The product's pandas 3 and pyarrow 26 (imported through sentence-transformers'
            # datasets) require numpy 2: versions that run on numpy 1.26, in the venv.
            "pandas==2.2.3",
            "pyarrow==21.0.0",
        ),
        unpinned=("numpy", "sentence-transformers"),
        why_unpinned=(
            "infinity-emb 0.0.78 requires numpy<2 and sentence-transformers<4; with numpy 1.26 come "
            "pandas 2.2 and pyarrow 21 of its own"
        ),
        check=(
            "import infinity_emb, optimum.onnxruntime, sentence_transformers, numpy, torch, pandas; "
            "from optimum.exporters.onnx import main_export; "
            "print(infinity_emb.__version__, sentence_transformers.__version__, numpy.__version__, torch.__version__)"
        ),
    ),
}


class PeerUnavailable(Exception):
    """A peer that did not install or start: the reason goes into its record."""


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def product_versions(names: Iterable[str] = PINNED_FROM_PRODUCT) -> dict[str, str]:
    """The versions of `names` installed where this bench runs (the product's venv)."""
    import importlib.metadata as metadata

    versions = {}
    for name in names:
        try:
            versions[canonical(name)] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def constraints_text(install: PeerInstall, installed: Mapping[str, str]) -> str:
    """pip constraints pinning the product's `installed` versions, less what the peer
    requires otherwise (install.unpinned)."""
    free = {canonical(name) for name in install.unpinned}
    lines = [
        f"{canonical(name)}=={version}"
        for name, version in sorted(installed.items())
        if canonical(name) not in free
    ]
    return "".join(line + "\n" for line in lines)


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def product_paths() -> list[str]:
    """The product venv's site-packages (this interpreter's), for the peers' .pth file."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_peer(
    install: PeerInstall,
    home: Path = PEERS_HOME,
    *,
    installed: Mapping[str, str] | None = None,
    pip_args: Sequence[str] = (),
    timeout: float = 3600,
) -> Path:
    """The venv of `install` under `home`, created and installed when missing or when its
    pins changed; its python. Raises PeerUnavailable with the reason when pip or the
    import check fails."""
    installed = product_versions() if installed is None else installed
    venv = home / install.name
    constraints = constraints_text(install, installed)
    wanted = {
        "requirements": list(install.requirements),
        "constraints": constraints,
        "product_paths": product_paths(),
    }
    marker = venv / "dwsearch-peer.json"
    python = venv_python(venv)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        found = json.loads(marker.read_text())
        found.pop("check_output", None)
        if found == wanted and python.exists():
            return python
    if venv.exists():
        shutil.rmtree(venv)
    home.mkdir(parents=True, exist_ok=True)
    # Without pip of its own: the product's pip installs into it (pip --python).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # The product's packages, after the venv's own: a peer's own versions shadow them.
    (site_packages(python) / "dwsearch-product.pth").write_text("".join(p + "\n" for p in product_paths()))
    (venv / "constraints.txt").write_text(constraints)
    log = venv / "install.log"
    command = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "-c",
        str(venv / "constraints.txt"),
        *pip_args,
        *install.requirements,
    ]
    with log.open("w") as out:
        try:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise PeerUnavailable(
                f"pip install {' '.join(install.requirements)} ran over {timeout:.0f} s"
            ) from None
    if done.returncode != 0:
        raise PeerUnavailable(
            f"pip install {' '.join(install.requirements)} failed: {pip_error(log.read_text())}"
        )
    if install.check:
        checked = subprocess.run(
            [str(python), "-c", install.check],
            capture_output=True,
            text=True,
            env={**os.environ, **OFFLINE_ENV},
            cwd=tempfile.gettempdir(),
        )
        if checked.returncode != 0:
            raise PeerUnavailable(f"installed, but does not import: {last_line(checked.stderr)}")
        wanted["check_output"] = checked.stdout.strip()
    marker.write_text(json.dumps(wanted, indent=2) + "\n")
    return python


def pip_error(output: str) -> str:
    """The lines of pip's output that say why it failed (its ERROR lines, else the last)."""
    errors = [line.strip() for line in output.splitlines() if line.startswith("ERROR")]
    return " ".join(errors)[-600:] if errors else last_line(output)


def last_line(output: str) -> str:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return lines[-1][-600:] if lines else "(no output)"


def skipped(reason: str) -> dict[str, str]:
    return {"skipped": reason}


def peer_python(name: str, home: Path = PEERS_HOME) -> Path:
    """ensure_peer for INSTALLS[name], or PeerUnavailable."""
    try:
        return ensure_peer(INSTALLS[name], home)
    except subprocess.CalledProcessError as exc:
        raise PeerUnavailable(f"could not make its venv: {exc}") from None


def installed_versions(name: str, home: Path = PEERS_HOME) -> dict[str, str]:
    """What a peer's venv runs, as its import check printed it."""
    with contextlib.suppress(OSError, ValueError):
        marker = json.loads((home / INSTALLS[name].name / "dwsearch-peer.json").read_text())
        versions = {
            "requirements": " ".join(marker["requirements"]),
            "imported": marker.get("check_output", ""),
        }
        if INSTALLS[name].why_unpinned:
            versions["own_versions_of"] = (
                f"{', '.join(INSTALLS[name].unpinned)} ({INSTALLS[name].why_unpinned}); "
                "the product's versions of the rest"
            )
        return versions
    return {}


# --- pure figures -----------------------------------------------------------------------------


def normalized(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def dense_cosines(vectors: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Row-wise cosine of `vectors` to `reference` (as many rows of `reference` as
    `vectors` has: an entry may have embedded fewer windows in its time budget)."""
    vectors = np.asarray(vectors)
    reference = np.asarray(reference)[: len(vectors)]
    if vectors.shape != reference.shape:
        raise ValueError(f"vectors {vectors.shape} against reference {reference.shape}")
    return np.sum(normalized(vectors) * normalized(reference), axis=-1)


def cosine_figures(
    queries: np.ndarray, windows: np.ndarray, reference_queries: np.ndarray, reference_windows: np.ndarray
) -> dict[str, float]:
    cosines = np.concatenate(
        [dense_cosines(queries, reference_queries), dense_cosines(windows, reference_windows)]
    )
    return {"dense_cosine_min": float(cosines.min()), "dense_cosine_mean": float(cosines.mean())}


def percentile(samples: Sequence[float], q: float) -> float:
    """bench.report.percentile (nearest rank), here so the peers' processes need no bench.report."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def timing_figures(
    query_latencies_s: Sequence[float], windows_done: int, windows_elapsed_s: float
) -> dict[str, float]:
    return {
        "query_p50_ms": percentile(query_latencies_s, 50) * 1000,
        "query_p99_ms": percentile(query_latencies_s, 99) * 1000,
        "queries": len(query_latencies_s),
        "windows_per_s": windows_done / windows_elapsed_s if windows_elapsed_s > 0 else float("nan"),
        "windows": windows_done,
    }


def measured(entry: Mapping[str, Any]) -> bool:
    return "skipped" not in entry and math.isfinite(entry.get("query_p50_ms", float("nan")))


def best_peer(entries: Mapping[str, Mapping[str, Any]], key: str, *, lowest: bool) -> str | None:
    """The peer (neither dwsearch nor the fp32 reference) best on `key`, among those measured."""
    candidates = {
        name: entry[key]
        for name, entry in entries.items()
        if name not in (DWSEARCH, REFERENCE)
        and measured(entry)
        and math.isfinite(entry.get(key, float("nan")))
    }
    if not candidates:
        return None
    return (min if lowest else max)(candidates, key=lambda name: candidates[name])


def peer_figures(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The section's figures: dwsearch's query p50, the best peer on query p50 (and on
    windows/s), and dwsearch over those peers (query p50 ratio ≤ 1 and windows/s ratio ≥ 1
    mean dwsearch is at least as fast)."""
    ours = entries.get(DWSEARCH, {})
    figures: dict[str, Any] = {"peers_dwsearch_query_p50_ms": ours.get("query_p50_ms", float("nan"))}
    by_query = best_peer(entries, "query_p50_ms", lowest=True)
    by_windows = best_peer(entries, "windows_per_s", lowest=False)
    figures["peers_best_peer"] = by_query or "none measured"
    figures["peers_best_peer_windows"] = by_windows or "none measured"
    nan = float("nan")
    figures["peers_query_p50_dwsearch_over_best_peer"] = (
        ours.get("query_p50_ms", nan) / entries[by_query]["query_p50_ms"]
        if by_query and measured(ours)
        else nan
    )
    figures["peers_windows_dwsearch_over_best_peer"] = (
        ours.get("windows_per_s", nan) / entries[by_windows]["windows_per_s"]
        if by_windows and measured(ours)
        else nan
    )
    return figures


def merge_by_class(previous: Mapping[str, Any] | None, cpu_class: str, record: Any) -> dict[str, Any]:
    """`previous` (a results file's {cpu_class: ...}) with this class's record replaced."""
    merged = dict(previous) if isinstance(previous, Mapping) else {}
    merged[cpu_class] = record
    return merged


# The int8 multiply-adds each class's kernels can start per cycle per core, ×2 for ops.
INT8_OPS_PER_CYCLE = {
    # AVX-512 VNNI: vpdpbusd on 512 bits = 64 u8×s8 multiply-adds, 2 per cycle where
    # the core has two 512-bit FMA ports (Xeon Scalable).
    "x86-vnni": 2 * 64 * 2,
    # AVX2: vpmaddubsw + vpmaddwd per 32 multiply-adds, on the two vector multiply ports.
    "x86-avx2": 32 * 2,
    # SSE4.1: pmaddubsw on 128 bits.
    "x86": 16 * 2,
    # ARM64 dot products: sdot/udot on 128 bits = 16 multiply-adds, 2 pipes.
    "arm64": 2 * 16 * 2,
}
# AMX (TMUL): a 16×64 by 64×16 int8 tile product, 16,384 multiply-adds, every 16 cycles.
AMX_INT8_OPS_PER_CYCLE = 1024 * 2


def encoder_parameters(config: Mapping[str, Any]) -> int:
    """A BERT / XLM-R encoder's parameters without the embeddings (and without the pooler):
    per layer the attention's four h×h projections, the feed-forward's h×i and i×h, their
    biases and two layer norms."""
    h = int(config["hidden_size"])
    i = int(config["intermediate_size"])
    layers = int(config["num_hidden_layers"])
    per_layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
    return layers * per_layer


def int8_ops_per_s(parameters: int, tokens_per_window: float, windows_per_s: float) -> float:
    """A multiply-add per parameter per token, two ops each."""
    return 2.0 * parameters * tokens_per_window * windows_per_s


def int8_peak_ops_per_s(cpu_class: str, mhz: float, cores: int) -> float:
    return INT8_OPS_PER_CYCLE.get(cpu_class, float("nan")) * mhz * 1e6 * cores


def limits_figures(
    *,
    copy_gb_s: float,
    query_weight_bytes: int,
    dwsearch_query_p50_ms: float,
    parameters: int,
    tokens_per_window: float,
    dwsearch_windows_per_s: float,
    cpu_class: str,
    mhz: float,
    cores: int,
) -> dict[str, float]:
    floor_ms = query_weight_bytes / (copy_gb_s * 1e9) * 1000 if copy_gb_s > 0 else float("nan")
    reached = int8_ops_per_s(parameters, tokens_per_window, dwsearch_windows_per_s)
    peak = int8_peak_ops_per_s(cpu_class, mhz, cores)
    return {
        "memory_copy_gb_s": copy_gb_s,
        "query_weight_read_floor_ms": floor_ms,
        "query_weight_read_floor_fraction": floor_ms / dwsearch_query_p50_ms,
        "windows_int8_tops": reached / 1e12,
        "windows_int8_peak_tops_estimate": peak / 1e12,
        "windows_int8_peak_fraction": reached / peak if peak > 0 else float("nan"),
    }


# --- the machine's limits ---------------------------------------------------------------------


def copy_bandwidth_gb_s(threads: int = THREADS, mib: int = 1024, passes: int = 5) -> float:
    """A STREAM-like copy: `threads` threads (numpy releases the GIL while copying) each copy
    their part of a `mib` MiB array into another; bytes read + written over the time of the
    slowest, best of `passes`."""
    from concurrent.futures import ThreadPoolExecutor

    n = mib * 1024 * 1024 // 8
    source = np.ones(n, dtype=np.float64)
    target = np.zeros(n, dtype=np.float64)
    bounds = np.linspace(0, n, threads + 1).astype(int)
    parts = [(source[a:b], target[a:b]) for a, b in itertools.pairwise(bounds)]
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda p: np.copyto(p[1], p[0]), parts))  # touch the pages first
        for _ in range(passes):
            started = time.perf_counter()
            list(pool.map(lambda p: np.copyto(p[1], p[0]), parts))
            elapsed = time.perf_counter() - started
            best = max(best, 2 * source.nbytes / elapsed / 1e9)
    return best


def onnx_weight_bytes(model_file: Path) -> dict[str, int]:
    """The bytes of an ONNX model's initializers, and of those only read by the rows a Gather
    picks (embedding tables, directly or through a DequantizeLinear): what one query reads is
    the rest, plus a few rows."""
    import onnx
    from onnx import helper

    model = onnx.load(str(model_file), load_external_data=False)
    graph = model.graph
    dequantized = {node.output[0]: node.input[0] for node in graph.node if node.op_type == "DequantizeLinear"}
    gathered = set()
    for node in graph.node:
        if node.op_type == "Gather":
            table = node.input[0]
            gathered.add(dequantized.get(table, table))
    total = tables = 0
    for tensor in graph.initializer:
        size = (
            int(np.prod(tensor.dims, dtype=np.int64))
            * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
        )
        total += size
        if tensor.name in gathered:
            tables += size
    return {"initializer_bytes": total, "gathered_table_bytes": tables, "per_query_bytes": total - tables}


def cpu_mhz() -> tuple[float, str]:
    """The clock for the peak estimate: lscpu's max MHz, else the highest /proc/cpuinfo MHz."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "CPU max MHz":
                return float(value), "lscpu CPU max MHz"
    with contextlib.suppress(OSError):
        values = [
            float(line.partition(":")[2])
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("cpu MHz")
        ]
        if values:
            return max(values), "/proc/cpuinfo cpu MHz"
    return float("nan"), "unknown"


def cpu_flags() -> set[str]:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    return set()


# --- the in-process entries (run by each venv's python: no dwsearch imports here) ---------------


def lexical_weights(
    ids: np.ndarray, mask: np.ndarray, weights: np.ndarray, unused: np.ndarray
) -> list[dict[int, float]]:
    """bge-m3's sparse vectors: per text, the largest weight per token id, > 0, without the
    special tokens (as dwsearch's bge-m3 backend computes them)."""
    out = []
    for row in range(len(ids)):
        keep = mask[row].astype(bool)
        token_ids = ids[row][keep]
        token_weights = weights[row][: len(token_ids)]
        chosen = (token_weights > 0) & ~np.isin(token_ids, unused)
        unique, where = np.unique(token_ids[chosen], return_inverse=True)
        best = np.zeros(len(unique), dtype=np.float32)
        np.maximum.at(best, where, token_weights[chosen])
        out.append(dict(zip(unique.tolist(), best.tolist(), strict=True)))
    return out


def _tokenizer(model_dir: str) -> tuple[Any, np.ndarray]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    unused = np.array(
        sorted(
            tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[key])
            for key in ("cls_token", "eos_token", "pad_token", "unk_token")
            if key in tokenizer.special_tokens_map
        ),
        dtype=np.int64,
    )
    return tokenizer, unused


Encoder = Callable[[list[str]], np.ndarray]


def _torch_encoder(job: Mapping[str, Any]) -> tuple[Encoder, dict[str, Any]]:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModel

    torch.set_num_threads(THREADS)
    torch.set_num_interop_threads(1)
    model_dir = job["model_dir"]
    tokenizer, unused = _tokenizer(model_dir)
    model = AutoModel.from_pretrained(
        model_dir, dtype=torch.float32, add_pooling_layer=False, local_files_only=True
    )
    model.eval()
    hidden_size = model.config.hidden_size
    sparse_linear = None
    head = Path(model_dir) / "sparse_linear.pt"
    if head.is_file():
        sparse_linear = torch.nn.Linear(hidden_size, 1)
        sparse_linear.load_state_dict(torch.load(head, map_location="cpu", weights_only=True))
        sparse_linear.eval()
    bf16 = job["precision"] == "bf16"

    def encode(texts: list[str]) -> np.ndarray:
        batch = tokenizer(texts, padding=True, truncation=True, max_length=8192, return_tensors="pt")
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with torch.inference_mode(), autocast:
            hidden = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).last_hidden_state
            dense = F.normalize(hidden[:, 0].float(), dim=-1).numpy()
            if sparse_linear is not None:
                weights = torch.relu(sparse_linear(hidden)).squeeze(-1).float().numpy()
                lexical_weights(batch["input_ids"].numpy(), batch["attention_mask"].numpy(), weights, unused)
        return dense

    flags = cpu_flags()
    about = {
        "runtime": f"torch {torch.__version__}",
        "precision": "bfloat16 autocast" if bf16 else "float32",
        "sparse": sparse_linear is not None,
        "threads": torch.get_num_threads(),
        "onednn_bf16_hardware": sorted(flags & {"avx512_bf16", "amx_bf16"}) or "none (bf16 emulated)",
    }
    return encode, about


def _openvino_core(threads: int = THREADS) -> Any:
    import openvino as ov

    core = ov.Core()
    core.set_property(
        "CPU",
        {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"},
    )
    return core


def _runtime_precisions(compiled: Any) -> dict[str, int]:
    """What the compiled model's matrix layers run in: {layerType:runtimePrecision: count}."""
    counts: dict[str, int] = {}
    with contextlib.suppress(Exception):
        for op in compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            kind = info["layerType"].astype(str)
            if kind in ("FullyConnected", "MatMul", "Convolution"):
                key = f"{kind}:{info['runtimePrecision'].astype(str)}:{info['primitiveType'].astype(str)}"
                counts[key] = counts.get(key, 0) + 1
    return counts


def _openvino_encoder(job: Mapping[str, Any]) -> tuple[Encoder, dict[str, Any]]:
    import openvino as ov

    core = _openvino_core()
    tokenizer, unused = _tokenizer(job["model_dir"])
    model = core.read_model(job["ir"])
    config: dict[str, Any] = {}
    if job.get("precision_hint"):
        config["INFERENCE_PRECISION_HINT"] = job["precision_hint"]
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    names = {name for output in compiled.outputs for name in output.get_names()}
    sparse = "sparse_weights" in names

    def encode(texts: list[str]) -> np.ndarray:
        batch = tokenizer(texts, padding=True, truncation=True, max_length=8192, return_tensors="np")
        ids = batch["input_ids"].astype(np.int64)
        mask = batch["attention_mask"].astype(np.int64)
        result = request.infer({"input_ids": ids, "attention_mask": mask})
        dense = np.asarray(result[compiled.output("dense")], dtype=np.float32)
        if sparse:
            lexical_weights(ids, mask, np.asarray(result[compiled.output("sparse_weights")]), unused)
        return normalized(dense).astype(np.float32)

    about = {
        "runtime": f"OpenVINO {ov.__version__}",
        "precision_hint_requested": job.get("precision_hint") or "default",
        "precision_hint_compiled": compiled.get_property("INFERENCE_PRECISION_HINT").to_string(),
        "cpu_optimization_capabilities": list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")),
        "matrix_layers_run_in": _runtime_precisions(compiled),
        "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
        "sparse": sparse,
    }
    return encode, about


def _openvino_prepare(job: Mapping[str, Any]) -> dict[str, Any]:
    """job["step"] "convert": the fp32 IR of dwsearch's fp32 ONNX export (fp32.xml);
    "quantize": nncf's int8 of that IR (int8.xml), calibrated on job["calibration"], one
    window per sample."""
    import nncf
    import openvino as ov

    started = time.perf_counter()
    out = Path(job["ir_dir"])
    core = _openvino_core()
    if job["step"] == "convert":
        model = core.read_model(str(Path(job["onnx_dir"]) / "model.onnx"))
        ov.save_model(model, str(out / "fp32.xml"), compress_to_fp16=False)
        return {"convert_s": time.perf_counter() - started, "peak_rss_mb": _own_peak_rss_mb()}
    model = core.read_model(str(out / "fp32.xml"))
    tokenizer, _ = _tokenizer(job["model_dir"])
    samples = []
    for text in job["calibration"]:
        batch = tokenizer([text], truncation=True, max_length=8192, return_tensors="np")
        samples.append(
            {
                "input_ids": batch["input_ids"].astype(np.int64),
                "attention_mask": batch["attention_mask"].astype(np.int64),
            }
        )
    quantized = nncf.quantize(
        model, nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(samples)
    )
    ov.save_model(quantized, str(out / "int8.xml"), compress_to_fp16=False)
    return {
        "quantize_s": time.perf_counter() - started,
        "calibration_windows": len(samples),
        "nncf": nncf.__version__,
        "peak_rss_mb": _own_peak_rss_mb(),
    }


def _own_peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(encode: Encoder, job: Mapping[str, Any]) -> dict[str, Any]:
    """Warm up, then queries one at a time and windows in batches, as every entry is measured."""
    queries, windows = job["queries"], job["windows"]
    per_call = job["per_call"]
    encode([queries[0]])
    ready_s = time.time() - job["spawned_at"]  # loaded, and answered (as a server is when serving)
    for text in queries[1:3]:
        encode([text])
    encode(windows[:per_call])
    latencies = []
    query_vectors: list[np.ndarray] = []
    for i in range(job["query_count"]):
        started = time.perf_counter()
        vector = encode([queries[i % len(queries)]])
        latencies.append(time.perf_counter() - started)
        if i < len(queries):
            query_vectors.append(vector[0])
    window_vectors: list[np.ndarray] = []
    started = time.perf_counter()
    for i in range(0, len(windows), per_call):
        window_vectors.extend(encode(windows[i : i + per_call]))
        if time.perf_counter() - started > job["budget_s"]:
            break
    elapsed = time.perf_counter() - started
    return {
        "start_s": ready_s,
        "query_latencies_s": latencies,
        "windows_done": len(window_vectors),
        "windows_elapsed_s": elapsed,
        "query_vectors": np.stack(query_vectors),
        "window_vectors": np.stack(window_vectors),
    }


def run_worker(job_file: Path) -> None:
    """One in-process entry (job["kind"]: torch | openvino | openvino-prepare), results to
    job["out"]: result.json, and queries.npy / windows.npy (the dense vectors)."""
    job = json.loads(job_file.read_text())
    out = Path(job["out"])
    if job["kind"] == "openvino-prepare":
        (out / "result.json").write_text(json.dumps(_openvino_prepare(job)))
        return
    encode, about = (_torch_encoder if job["kind"] == "torch" else _openvino_encoder)(job)
    result = _measure(encode, job)
    np.save(out / "queries.npy", result.pop("query_vectors"))
    np.save(out / "windows.npy", result.pop("window_vectors"))
    result |= about | {"peak_rss_mb": _own_peak_rss_mb()}
    (out / "result.json").write_text(json.dumps(result, default=str))


# --- the parent: running the entries ----------------------------------------------------------


@dataclass
class Plan:
    """What every entry embeds, and where."""

    model_dir: Path
    model_id: str
    queries: list[str]
    windows: list[str]
    calibration: list[str]
    query_count: int
    budget_s: float
    quick: bool
    work: Path
    home: Path = PEERS_HOME
    reference: dict[str, np.ndarray] = field(default_factory=dict)

    def job(self, **extra: Any) -> dict[str, Any]:
        return {
            "model_dir": str(self.model_dir),
            "queries": self.queries,
            "windows": self.windows,
            "query_count": self.query_count,
            "per_call": WINDOWS_PER_CALL,
            "budget_s": self.budget_s,
            **extra,
        }


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **THREAD_ENV, **OFFLINE_ENV, "HF_HOME": str(PEERS_HOME / "hf"), **extra}


def worker_process(python: Path, job: dict[str, Any], work: Path, timeout: float = 3600) -> dict[str, Any]:
    """Run one job in `python` (its own process) and read what it wrote."""
    out = Path(tempfile.mkdtemp(prefix=f"{job['kind']}-", dir=work))
    job = {**job, "out": str(out), "spawned_at": time.time()}
    job_file = out / "job.json"
    job_file.write_text(json.dumps(job))
    log = out / "worker.log"
    with log.open("w") as stream:
        try:
            done = subprocess.run(
                [str(python), "-m", "bench.embedder_peers", "worker", str(job_file)],
                cwd=REPO,
                env=child_env(PYTHONPATH=str(REPO)),
                stdout=stream,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise PeerUnavailable(f"ran over {timeout:.0f} s") from None
    if done.returncode != 0:
        raise PeerUnavailable(f"exited with {done.returncode}: {worker_error(log.read_text())}")
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    if (out / "queries.npy").is_file():
        result["query_vectors"] = np.load(out / "queries.npy")
        result["window_vectors"] = np.load(out / "windows.npy")
    return result


def worker_error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors[-1] if errors else lines[-1] if lines else "(no output)").strip()[-600:]


def entry_record(raw: Mapping[str, Any], plan: Plan, cpu_class: str) -> dict[str, Any]:
    """An entry's figures from what it measured: timings, cosine to the reference, the rest
    as the entry described itself."""
    record: dict[str, Any] = timing_figures(
        raw["query_latencies_s"], raw["windows_done"], raw["windows_elapsed_s"]
    )
    if plan.reference:
        record |= cosine_figures(
            raw["query_vectors"], raw["window_vectors"], plan.reference["queries"], plan.reference["windows"]
        )
        record["passes_cosine_guard"] = record["dense_cosine_min"] >= COSINE_GUARD
    skip = {"query_latencies_s", "windows_done", "windows_elapsed_s", "query_vectors", "window_vectors"}
    record |= {key: value for key, value in raw.items() if key not in skip}
    record["cpu_class"] = cpu_class
    return record


# dwsearch, over gRPC


async def _grpc_measure(port: int, plan: Plan) -> dict[str, Any]:
    import grpc

    from dwsearch.v1 import embedder_pb2 as pb
    from dwsearch.v1 import embedder_pb2_grpc as pb_grpc

    def dense(embedding: Any) -> np.ndarray:
        return np.asarray(embedding.dense, dtype=np.float32)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.EmbedderServiceStub(channel)

        async def query(text: str) -> Any:
            request = pb.EmbedRequest(inputs=[text], input_type=pb.INPUT_TYPE_QUERY, sparse=True)
            return (await stub.Embed(request, timeout=600)).embeddings[0]

        async def windows(batch: list[str]) -> list[Any]:
            request = pb.EmbedRequest(inputs=batch, truncate=True, sparse=True)
            return list((await stub.Embed(request, timeout=1800)).embeddings)

        return await _measure_client(query, windows, dense, plan, sparse=lambda e: bool(e.sparse.indices))


async def _measure_client(
    query: Callable[[str], Any],
    windows: Callable[[list[str]], Any],
    dense: Callable[[Any], np.ndarray],
    plan: Plan,
    *,
    sparse: Callable[[Any], bool],
    clients: int = 2,
) -> dict[str, Any]:
    """_measure through a server: the same warm-up and texts; windows in calls of
    WINDOWS_PER_CALL from `clients` concurrent clients, until done or the budget is spent."""
    for text in plan.queries[:3]:
        await query(text)
    await windows(plan.windows[:WINDOWS_PER_CALL])
    latencies = []
    query_vectors = []
    gave_sparse = False  # any sparse vector in the answers (a text may have none)
    for i in range(plan.query_count):
        started = time.perf_counter()
        answer = await query(plan.queries[i % len(plan.queries)])
        latencies.append(time.perf_counter() - started)
        if i < len(plan.queries):
            query_vectors.append(dense(answer))
            gave_sparse = gave_sparse or sparse(answer)
    calls = [plan.windows[i : i + WINDOWS_PER_CALL] for i in range(0, len(plan.windows), WINDOWS_PER_CALL)]
    results: dict[int, list[Any]] = {}
    order = list(range(len(calls)))
    started = time.perf_counter()

    async def client() -> None:
        while order and time.perf_counter() - started <= plan.budget_s:
            index = order.pop(0)
            results[index] = await windows(calls[index])

    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    # The calls that completed, in order, up to the first that did not (to match the reference rows).
    done: list[Any] = []
    for index in range(len(calls)):
        if index not in results:
            break
        done += results[index]
    return {
        "query_latencies_s": latencies,
        "windows_done": sum(len(batch) for batch in results.values()),
        "windows_elapsed_s": elapsed,
        "query_vectors": np.stack(query_vectors),
        "window_vectors": np.stack([dense(item) for item in done]),
        "sparse": gave_sparse or any(sparse(item) for item in done),
    }


def run_dwsearch(plan: Plan) -> dict[str, Any]:
    """`dwsearch embedder` with its defaults for this CPU (the export made beforehand by a
    first start, so start_s is a start from the cache)."""
    from bench.embedder import Server, peak_rss_mb_of

    flags = ("--embed-model", str(plan.model_dir), "--embed-model-id", plan.model_id)
    prepare_s = 0.0
    if dwsearch_export_dir(plan, served=True) is None:
        started = time.perf_counter()
        with Server(*flags):
            pass
        prepare_s = time.perf_counter() - started
    started = time.perf_counter()
    with Server(*flags) as server:
        ready_s = time.perf_counter() - started
        raw = asyncio.run(_grpc_measure(server.port, plan))
        info = server.info()
        raw |= {
            "start_s": ready_s,
            "prepare_s": prepare_s,
            "peak_rss_mb": peak_rss_mb_of(server.proc.pid),
            "runtime": info.runtime,
            "dtype": info.dtype,
            "quantization": info.runtime_report.quantization,
            "sparse_supported": info.sparse_supported,
            "runtime_note": info.runtime_report.note,
            "warm_up_query_latency_ms": info.query_latency_ms,
            "threads": THREADS,
            "served": "gRPC Embed, dense + sparse (flags: none besides the model)",
        }
    return raw


def dwsearch_choice() -> tuple[str, str]:
    """The runtime and quantization `dwsearch embedder` picks by default on this CPU."""
    from dwsearch.modelserver import onnxload

    choice = onnxload.choose_runtime("auto", "auto", device="cpu", dtype="auto")
    return choice.runtime, choice.quantize


def dwsearch_export_dir(plan: Plan, *, served: bool, quantize: str | None = None) -> Path | None:
    """Where dwsearch keeps the ONNX export the embedder serves by default (served=True) or
    of `quantize`; None when it is not there yet."""
    from dwsearch.modelserver import onnxexport

    if served:
        runtime, quantize = dwsearch_choice()
        if runtime != "onnx":
            return None
    assert quantize is not None
    source = _source(plan.model_dir, plan.model_id)
    entry = onnxexport.cache_entry(onnxexport.default_cache_dir(), source, "embedder", "bge-m3", quantize)
    return entry if onnxexport.read_manifest(entry) is not None else None


@functools.cache
def _source(model_dir: Path, model_id: str) -> Any:
    """The model as dwsearch's export cache keys it (hashing the weights once per run)."""
    from dwsearch.modelserver import onnxexport
    from dwsearch.modelserver.modelfiles import resolve_model

    resolved = resolve_model(str(model_dir), model_id)
    return onnxexport.Source.of(resolved.path, resolved.model_id, resolved.revision)


def dwsearch_fp32_export(plan: Plan) -> tuple[Path, float]:
    """dwsearch's fp32 ONNX export of the model (what its int8 is quantized from), made
    with `dwsearch export-onnx --quantize none` when missing; (directory, seconds spent)."""
    found = dwsearch_export_dir(plan, served=False, quantize="none")
    if found is not None:
        return found, 0.0
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dwsearch.cli",
            "export-onnx",
            "--model",
            str(plan.model_dir),
            "--model-id",
            plan.model_id,
            "--quantize",
            "none",
            "--log-level",
            "warning",
        ],
        env={**child_env(), "DWSEARCH_THREADS": str(THREADS)},
        capture_output=True,
        text=True,
    )
    found = dwsearch_export_dir(plan, served=False, quantize="none")
    if done.returncode != 0 or found is None:
        raise PeerUnavailable(
            f"dwsearch export-onnx --quantize none failed: {last_line(done.stderr or done.stdout)}"
        )
    return found, time.perf_counter() - started


# Infinity, over HTTP

# bge-m3 as its repository ships it for sentence-transformers: CLS pooling, normalized.
ST_FILES = {
    "modules.json": [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ],
    "sentence_bert_config.json": {"max_seq_length": None, "do_lower_case": False},  # the model's limit
    "1_Pooling/config.json": {
        "word_embedding_dimension": None,  # the model's hidden size
        "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    },
}


def repository_layout(model_dir: Path, home: Path = PEERS_HOME) -> Path:
    """The model's files (linked, not copied) with the sentence-transformers files bge-m3's
    repository has, in the peers' cache: what Infinity loads."""
    config = json.loads((model_dir / "config.json").read_text())
    digest = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:10]
    target = home / "models" / f"{model_dir.name}-{digest}"
    target.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        link = target / item.name
        if item.name.startswith(("onnx", "model.onnx")) or link.exists() or link.is_symlink():
            continue
        link.symlink_to(item.resolve())
    for name, content in ST_FILES.items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, dict) and "word_embedding_dimension" in content:
            content = {**content, "word_embedding_dimension": config["hidden_size"]}
        if isinstance(content, dict) and "max_seq_length" in content:
            # XLM-R's positions start after the padding index (8192 for bge-m3).
            limit = config["max_position_embeddings"] - config["pad_token_id"] - 1
            content = {**content, "max_seq_length": limit}
        path.write_text(json.dumps(content, indent=2) + "\n")
    (target / "2_Normalize").mkdir(exist_ok=True)
    return target


OPTIMUM_EXPORT = """
import sys
from optimum.exporters.onnx import main_export
main_export(sys.argv[1], output=sys.argv[2], task="feature-extraction", library_name="transformers",
            do_validation=False, device="cpu")
"""


def optimum_export(python: Path, layout: Path) -> float:
    """model.onnx (and its external data) in the layout, exported by optimum when missing;
    seconds spent. At the layout's root: Infinity 0.0.78 hands optimum-onnx 0.1.0 the file's
    path in the repository as its file name, which optimum matches against bare names, so
    an ONNX in onnx/ (where bge-m3's repository keeps it) is not found."""
    if (layout / "model.onnx").is_file():
        return 0.0
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=".onnx-export-", dir=layout.parent))
    try:
        done = subprocess.run(
            [str(python), "-c", OPTIMUM_EXPORT, str(layout), str(work)],
            env=child_env(),
            capture_output=True,
            text=True,
            cwd=tempfile.gettempdir(),
        )
        if done.returncode != 0 or not (work / "model.onnx").is_file():
            raise PeerUnavailable(f"optimum's ONNX export failed: {worker_error(done.stderr or done.stdout)}")
        graphs = sorted(work.glob("model.onnx*"), key=lambda path: path.name == "model.onnx")
        for graph in graphs:  # model.onnx last: its presence says the export is whole
            os.replace(graph, layout / graph.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return time.perf_counter() - started


INFINITY_OPTIMIZE = """
import sys
from pathlib import Path
from huggingface_hub.constants import HUGGINGFACE_HUB_CACHE
from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTOptimizer
from optimum.onnxruntime.configuration import OptimizationConfig
model = ORTModelForFeatureExtraction.from_pretrained(".", file_name="model.onnx", provider="CPUExecutionProvider")
config = OptimizationConfig(optimization_level=99, optimize_for_gpu=False, fp16=False)
ORTOptimizer.from_pretrained(model).optimize(
    optimization_config=config, save_dir=sys.argv[1], one_external_file=True
)
"""


def infinity_hf_home(layout: Path, home: Path = PEERS_HOME) -> Path:
    """Infinity's Hugging Face cache for a layout: one each, since the optimum engine keeps
    the graph it optimized there under the model id, which is "." for every layout."""
    return home / "hf" / layout.name


def infinity_optimize(python: Path, layout: Path, home: Path = PEERS_HOME) -> float:
    """The optimized graph Infinity's optimum engine loads, made when missing; seconds spent.

    Infinity 0.0.78 optimizes a model on its first start (ORTOptimizer, level 99) and keeps
    the result in <HF hub cache>/infinity_onnx/<provider>/<model id>, where its later starts
    find it. With optimum-onnx 0.1.0 that call fails (its OptimizationConfig no longer takes
    optimize_with_onnxruntime_only) and Infinity serves the graph unoptimized; this makes the
    same optimization with the same settings, less that argument, where Infinity looks."""
    target = infinity_hf_home(layout, home) / "hub" / "infinity_onnx" / "CPUExecutionProvider"
    if any(target.glob("*_optimized.onnx")):
        return 0.0
    started = time.perf_counter()
    shutil.rmtree(target, ignore_errors=True)
    done = subprocess.run(
        [str(python), "-c", INFINITY_OPTIMIZE, str(target)],
        env=child_env(HF_HOME=str(infinity_hf_home(layout, home))),
        capture_output=True,
        text=True,
        cwd=layout,
    )
    if done.returncode != 0 or not any(target.glob("*_optimized.onnx")):
        shutil.rmtree(target, ignore_errors=True)
        raise PeerUnavailable(
            f"optimizing the ONNX graph as Infinity does failed: {worker_error(done.stderr)}"
        )
    return time.perf_counter() - started


class InfinityServer:
    """`infinity_emb v2` serving the layout on a free port.

    It runs in the layout with the model id "." : Infinity 0.0.78 lists a local model's ONNX
    files by absolute path, which optimum then looks for relative to the model (and does not
    find); relative to "." they match. Its Hugging Face cache (where the optimum engine keeps
    the graph it optimized, under the model id) is one per layout."""

    def __init__(self, python: Path, layout: Path, engine: str, log: Path, home: Path = PEERS_HOME) -> None:
        from dwsearch_testkit.net import free_port

        self.port = free_port()
        self.log = log.open("w")
        command = [
            str(python.parent / "infinity_emb"),
            "v2",
            "--model-id",
            ".",
            "--served-model-name",
            "bge-m3",
            "--engine",
            engine,
            "--device",
            "cpu",
            "--batch-size",
            str(WINDOWS_PER_CALL),
            "--pooling-method",
            "cls",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(
            command,
            env=child_env(HF_HOME=str(infinity_hf_home(layout, home))),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=layout,
        )

    def wait_ready(self, timeout: float = 3600) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.flush()
                raise PeerUnavailable(
                    f"infinity_emb exited with {self.proc.returncode}: {worker_error(Path(self.log.name).read_text())}"
                )
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.5)
        raise PeerUnavailable(f"infinity_emb not ready after {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


async def _http_measure(port: int, plan: Plan) -> dict[str, Any]:
    from bench.embedder import _HttpConnection

    query_connection = await _HttpConnection.open(port)
    pool = [await _HttpConnection.open(port) for _ in range(2)]
    free = list(pool)

    async def query(text: str) -> Any:
        return (await query_connection.post("/embeddings", {"model": "bge-m3", "input": [text]}))["data"][0]  # type: ignore[index]

    async def windows(batch: list[str]) -> list[Any]:
        connection = free.pop()
        try:
            answer = await connection.post("/embeddings", {"model": "bge-m3", "input": batch})
        finally:
            free.append(connection)
        return sorted(answer["data"], key=lambda item: item["index"])  # type: ignore[index]

    try:
        return await _measure_client(
            query,
            windows,
            lambda item: np.asarray(item["embedding"], dtype=np.float32),
            plan,
            sparse=lambda item: False,
        )
    finally:
        for connection in (query_connection, *pool):
            await connection.close()


def run_infinity(plan: Plan, engine: str) -> dict[str, Any]:
    from bench.embedder import peak_rss_mb_of

    python = peer_python("infinity", plan.home)
    layout = repository_layout(plan.model_dir, plan.home)
    prepare_s = 0.0
    if engine == "optimum":
        prepare_s += optimum_export(python, layout)
        prepare_s += infinity_optimize(python, layout, plan.home)
    started = time.perf_counter()
    server = InfinityServer(python, layout, engine, plan.work / f"infinity-{engine}.log", plan.home)
    try:
        server.wait_ready()
        ready_s = time.perf_counter() - started
        raw = asyncio.run(_http_measure(server.port, plan))
        raw |= {
            "start_s": ready_s,
            "prepare_s": prepare_s,
            "peak_rss_mb": peak_rss_mb_of(server.proc.pid),
            "runtime": f"infinity-emb engine {engine}",
            "served": "HTTP POST /embeddings (OpenAI-style), float JSON",
            "sparse": False,
            "sparse_note": "Infinity's embeddings API returns dense vectors only",
            "threads": f"OMP_NUM_THREADS={THREADS}"
            + (
                "; ONNX Runtime's intra-op pool: its default, the physical cores"
                if engine == "optimum"
                else ""
            ),
            "versions": installed_versions("infinity", plan.home),
        }
        if engine == "optimum":
            raw["onnx"] = (
                "optimum's fp32 export (feature-extraction), optimized as Infinity optimizes it "
                "(ORTOptimizer, level 99, for CPU: see infinity_optimize)"
            )
        return raw
    finally:
        server.stop()


# OpenVINO and torch, in-process


def openvino_ir(plan: Plan, python: Path, step: str) -> tuple[Path, dict[str, Any], float]:
    """The IR directory with `step` done ("convert": fp32.xml from dwsearch's fp32 export;
    "quantize": nncf's int8.xml too), made once and cached: (directory, what the step
    recorded when it was made, seconds spent on preparation in this run)."""
    onnx_dir, spent = dwsearch_fp32_export(plan)
    manifest = json.loads((onnx_dir / "dwsearch-onnx.json").read_text())
    key = hashlib.sha256(
        json.dumps([manifest.get("fingerprint"), INSTALLS["openvino"].requirements]).encode()
    ).hexdigest()[:12]
    ir_dir = plan.home / "openvino-ir" / key
    steps = ["convert"] if step == "convert" else ["convert", "quantize"]
    recorded: dict[str, Any] = {"source": f"dwsearch's fp32 ONNX export ({onnx_dir.name})"}
    for name in steps:
        # The int8 IR depends on its calibration set too.
        marker = ir_dir / (
            f"{name}.json"
            if name == "convert"
            else f"quantize-{len(plan.calibration)}-{CALIBRATION_SEED}.json"
        )
        if not marker.is_file():
            started = time.perf_counter()
            ir_dir.mkdir(parents=True, exist_ok=True)
            made = worker_process(
                python,
                {
                    "kind": "openvino-prepare",
                    "step": name,
                    "model_dir": str(plan.model_dir),
                    "onnx_dir": str(onnx_dir),
                    "ir_dir": str(ir_dir),
                    "calibration": plan.calibration,
                },
                plan.work,
            )
            spent += time.perf_counter() - started
            marker.write_text(json.dumps(made))
        recorded[name] = json.loads(marker.read_text())
    return ir_dir, recorded, spent


def run_openvino(plan: Plan, variant: str) -> dict[str, Any]:
    python = peer_python("openvino", plan.home)
    ir_dir, recorded, spent = openvino_ir(plan, python, "quantize" if variant == "int8" else "convert")
    if variant == "int8":
        job = plan.job(kind="openvino", ir=str(ir_dir / "int8.xml"), precision_hint="")
    else:
        job = plan.job(kind="openvino", ir=str(ir_dir / "fp32.xml"), precision_hint="bf16")
    raw = worker_process(python, job, plan.work)
    raw["prepare_s"] = spent
    raw["prepared"] = recorded
    if variant == "int8":
        raw["quantization"] = (
            f"nncf.quantize (ModelType.TRANSFORMER, {recorded['quantize'].get('calibration_windows')} "
            "calibration windows, one per sample), default precision for the rest"
        )
    raw["versions"] = installed_versions("openvino", plan.home)
    return raw


def run_torch(plan: Plan, precision: str) -> dict[str, Any]:
    raw = worker_process(Path(sys.executable), plan.job(kind="torch", precision=precision), plan.work)
    raw["served"] = "in-process (transformers AutoModel, CLS pooling, normalized)"
    return raw


# --- the section ------------------------------------------------------------------------------


def entries_to_run(plan: Plan) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    return [
        (REFERENCE, lambda: run_torch(plan, "fp32")),
        (DWSEARCH, lambda: run_dwsearch(plan)),
        ("infinity-torch", lambda: run_infinity(plan, "torch")),
        ("infinity-optimum", lambda: run_infinity(plan, "optimum")),
        ("openvino-int8-nncf", lambda: run_openvino(plan, "int8")),
        ("openvino-bf16", lambda: run_openvino(plan, "bf16")),
        ("torch-bf16-autocast", lambda: run_torch(plan, "bf16")),
    ]


def run_entries(plan: Plan, cpu_class: str, only: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {}
    for name, run in entries_to_run(plan):
        if only and name not in only and name != REFERENCE:
            continue
        started = time.perf_counter()
        try:
            raw = run()
        except PeerUnavailable as exc:
            entries[name] = skipped(str(exc))
        except (Exception, SystemExit) as exc:  # one entry's failure (or an embedder's exit) ends only it
            entries[name] = skipped(f"failed: {type(exc).__name__}: {exc}"[:600])
        else:
            if name == REFERENCE:
                plan.reference = {"queries": raw["query_vectors"], "windows": raw["window_vectors"]}
                # The reference's own windows may have stopped at the budget: the others compare on those.
                plan.windows = plan.windows[: len(raw["window_vectors"])]
            entries[name] = entry_record(raw, plan, cpu_class)
        entries[name]["entry_wall_s"] = time.perf_counter() - started
        print(name, {k: v for k, v in entries[name].items() if not isinstance(v, (dict, list))}, flush=True)
    return entries


def tokens_per_window(model_dir: Path, windows: Sequence[str]) -> float:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return float(np.mean([len(encoding.ids) for encoding in tokenizer.encode_batch(list(windows))]))


def measure_limits(
    plan: Plan, entries: Mapping[str, Mapping[str, Any]], cpu_class: str, quick: bool
) -> dict[str, Any]:
    ours = entries.get(DWSEARCH, {})
    copy_gb_s = copy_bandwidth_gb_s(mib=256 if quick else 1024, passes=3 if quick else 6)
    export = dwsearch_export_dir(plan, served=True)
    weights = (
        onnx_weight_bytes(export / "model.onnx")
        if export is not None
        else {"per_query_bytes": 0, "note": "not ONNX"}
    )
    config = json.loads((plan.model_dir / "config.json").read_text())
    parameters = encoder_parameters(config)
    tokens = tokens_per_window(plan.model_dir, plan.windows)
    mhz, mhz_source = cpu_mhz()
    limits: dict[str, Any] = {
        "served_export": export.name if export is not None else None,
        **weights,
        "encoder_parameters_without_embeddings": parameters,
        "tokens_per_window": tokens,
        "clock_mhz": mhz,
        "clock_source": mhz_source,
        "cores": THREADS,
        "int8_ops_per_cycle_per_core_assumed": INT8_OPS_PER_CYCLE.get(cpu_class),
        "amx_int8": "amx_int8" in cpu_flags(),
        "formula": (
            "windows_int8_tops = 2 × encoder parameters (no embeddings) × tokens per window × windows/s; "
            "peak = int8 ops per cycle per core (assumed, INT8_OPS_PER_CYCLE) × clock × cores: an estimate"
        ),
    }
    if limits["amx_int8"]:
        limits["amx_int8_peak_tops_estimate"] = AMX_INT8_OPS_PER_CYCLE * mhz * 1e6 * THREADS / 1e12
    if measured(ours):
        limits |= limits_figures(
            copy_gb_s=copy_gb_s,
            query_weight_bytes=int(weights["per_query_bytes"]),
            dwsearch_query_p50_ms=ours["query_p50_ms"],
            parameters=parameters,
            tokens_per_window=tokens,
            dwsearch_windows_per_s=ours["windows_per_s"],
            cpu_class=cpu_class,
            mhz=mhz,
            cores=THREADS,
        )
    else:
        limits["memory_copy_gb_s"] = copy_gb_s
    return limits


LIMIT_FIGURES = (
    "memory_copy_gb_s",
    "query_weight_read_floor_ms",
    "query_weight_read_floor_fraction",
    "windows_int8_tops",
    "windows_int8_peak_tops_estimate",
    "windows_int8_peak_fraction",
)


def assemble(
    entries: Mapping[str, Mapping[str, Any]],
    limits: Mapping[str, Any],
    cpu_class: str,
    previous_params: Mapping[str, Any],
    run: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The section's figures and params, the per-class records merged with the results
    file's other classes."""
    figures = peer_figures(entries) | {key: limits[key] for key in LIMIT_FIGURES if key in limits}
    params = {
        "peers": merge_by_class(previous_params.get("peers"), cpu_class, dict(entries)),
        "peers_limits": merge_by_class(previous_params.get("peers_limits"), cpu_class, dict(limits)),
        "peers_runs": merge_by_class(previous_params.get("peers_runs"), cpu_class, dict(run)),
    }
    return figures, params


def plan_for(quick: bool, work: Path) -> Plan:
    from bench.embedder import FULLSIZE_ID, QUERIES, chat_windows

    if quick:
        model_dir, model_id = quick_model_dir(), "bge-m3-quick-random"
    else:
        from dwsearch_testkit.tiny_models import fullsize_bge_m3_dir

        model_dir, model_id = fullsize_bge_m3_dir(), FULLSIZE_ID
    windows = QUICK["windows"] if quick else WINDOWS
    return Plan(
        model_dir=model_dir,
        model_id=model_id,
        queries=list(QUERIES),
        windows=chat_windows(windows),
        calibration=chat_windows(
            QUICK["calibration"] if quick else CALIBRATION_WINDOWS, seed=CALIBRATION_SEED
        ),
        query_count=QUICK["queries"] if quick else QUERY_COUNT,
        budget_s=QUICK["budget_s"] if quick else WINDOWS_BUDGET_S,
        quick=quick,
        work=work,
    )


def build_quick_model(directory: Path) -> Path:
    """bge-m3 at a tiny size (dwsearch_testkit.tiny_models' tiny bge-m3: 2 layers, hidden
    32, the real tokenizer, the sparse and colbert heads) with bge-m3's 8192-token limit,
    which the peers size their inputs by (the testkit's tiny model has 512)."""
    from dwsearch_testkit.tiny_models import FULL_SIZE_MAX_TOKENS, build_tiny_bge_m3

    return build_tiny_bge_m3(directory, max_tokens=FULL_SIZE_MAX_TOKENS)


def quick_model_dir(home: Path = PEERS_HOME) -> Path:
    """build_quick_model's model for --quick, built once into the peers' cache."""
    target = home / "models" / "bge-m3-quick"
    if not (target / "config.json").is_file():
        home.joinpath("models").mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(prefix=".bge-m3-quick-", dir=home / "models"))
        try:
            build_quick_model(temporary)
            os.replace(temporary, target)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
    return target


def peers(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The section bench.embedder runs as `--sections peers`."""
    from bench import report
    from bench.embedder import previous_results

    machine = report.machine()
    cpu_class = machine["cpu_class"]
    only = [
        name.strip() for name in os.environ.get("DWSEARCH_BENCH_PEERS_ONLY", "").split(",") if name.strip()
    ]
    with tempfile.TemporaryDirectory(prefix="dwsearch-peers-") as work:
        plan = plan_for(quick, Path(work))
        started = time.perf_counter()
        entries = run_entries(plan, cpu_class, only)
        limits = measure_limits(plan, entries, cpu_class, quick)
    runtime, quantize = dwsearch_choice()
    run = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_model": machine["cpu_model"],
        "cpus": machine["cpus"],
        "quick": quick,
        "model": f"{plan.model_id} ({plan.model_dir.name})",
        "queries": plan.query_count,
        "windows": len(plan.windows),
        "windows_per_call": WINDOWS_PER_CALL,
        "threads": THREADS,
        "windows_budget_s": plan.budget_s,
        "dwsearch_default_choice": f"{runtime} {quantize}",
        "wall_s": time.perf_counter() - started,
        "only": only or "all",
    }
    _, previous_params = previous_results()
    return assemble(entries, limits, cpu_class, previous_params, run)


def install_all(home: Path = PEERS_HOME) -> dict[str, Any]:
    """Install (or check) every peer's venv: {peer: its versions, or the skip record}."""
    out: dict[str, Any] = {}
    for name in INSTALLS:
        try:
            peer_python(name, home)
            out[name] = installed_versions(name, home)
        except PeerUnavailable as exc:
            out[name] = skipped(str(exc))
    return out


def main(argv: Sequence[str]) -> None:
    if len(argv) >= 2 and argv[0] == "worker":
        run_worker(Path(argv[1]))
    elif argv[:1] == ["install"]:
        print(json.dumps(install_all(), indent=2))
    else:
        raise SystemExit(
            "usage: python -m bench.embedder_peers worker JOB | install  (the section: bench.embedder)"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
