"""torch vs ONNX Runtime (float32, int8) for the embedder's backends, in-process: what the
`auto` runtime and quantization defaults rest on (issue 13).

    python -m bench.onnx [--quick] [--model fullsize|minilm] [--threads N]

Each configuration runs in a fresh process (so peak RSS is its own), in this order: torch
float32, ONNX Runtime float32, ONNX Runtime int8 in this CPU class's variant (8-bit weights
with VNNI, 7-bit on AVX2: dwsearch.modelserver.cpuclass) and, where 8-bit runs exactly, int8-7bit
too. `machine.cpu_class` in the result says which class measured it. An ONNX configuration
first exports into
a fresh cache directory, timed (export seconds, bytes on disk, peak RSS of export plus
load), then times one 16-token query (p50 over repeats, after a warm-up) and one batch of
16 inputs of 128 tokens, and compares its dense vectors with torch's (cosine); an int8
configuration also reports its export's check against float32 on the shipped probe set.
`fullsize` is bge-m3's real shape with random weights (tests/testkit/dwsearch_testkit/tiny_models.py;
built once into ~/.cache/dwsearch-bench, 2.3 GB): it times like the real checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import report
from dwsearch_testkit.text import CHAT_WORDS

ROOT = Path(__file__).resolve().parent.parent


def configs() -> list[tuple[str, str]]:
    from dwsearch.modelserver import cpuclass

    out = [("torch", "none"), ("onnx", "none"), ("onnx", cpuclass.int8_variant(cpuclass.detect()))]
    if out[-1][1] != cpuclass.INT8_7BIT:
        out.append(("onnx", cpuclass.INT8_7BIT))
    return out


# The inputs' words: the first 26 of the chat words, as the figures were measured.
WORDS = CHAT_WORDS[:26]


def _ids(backend, words: int, rows: int, tokens: int) -> list:
    """`rows` prepared inputs of exactly `tokens` tokens (text of repeated words, cut)."""
    from dwsearch_embedder.backends.base import InputType

    texts = [" ".join(WORDS[(row + i) % len(WORDS)] for i in range(words)) for row in range(rows)]
    prepared = backend.prepare(texts, InputType.DOCUMENT, tokens)
    assert all(item.length == tokens for item in prepared), [item.length for item in prepared]
    return prepared


def run_one(model: str, runtime: str, quantize: str, threads: int, repeats: int, out: Path) -> None:
    from dwsearch_embedder.backends.bge_m3 import BgeM3Backend
    from dwsearch_embedder.backends.sentence_transformers import SentenceTransformersBackend
    from dwsearch_testkit.tiny_models import fullsize_bge_m3_dir, minilm_dir

    path, cls = (
        (fullsize_bge_m3_dir(), BgeM3Backend)
        if model == "fullsize"
        else (minilm_dir(), SentenceTransformersBackend)
    )
    with tempfile.TemporaryDirectory(prefix="bench-onnx-cache-") as cache:
        backend = cls(
            str(path),
            device="cpu",
            threads=threads,
            runtime=runtime,
            quantize=quantize,
            onnx_cache_dir=Path(cache),
        )
        started = time.perf_counter()
        info = backend.load()  # the session holds the model: the files can go
        load_s = time.perf_counter() - started
    load_rss = report.peak_rss_mb()
    figures: dict = {"load_s": load_s, "dtype": info.dtype, "runtime": info.runtime}
    report_ = info.runtime_report
    figures["quantization"] = report_.quantization
    onnx_model = getattr(backend, "_onnx", None)
    if onnx_model is not None:
        figures["export_s"] = onnx_model.manifest["export_seconds"]
        figures["onnx_mb"] = onnx_model.manifest["bytes"] / 1e6
    if report_.check is not None:
        figures["check_passed"] = report_.check.passed
        figures["check_dense_cosine_mean"] = report_.check.dense_cosine_mean
        figures["check_dense_cosine_min"] = report_.check.dense_cosine_min
        figures["check_sparse_top_terms_same"] = report_.check.sparse_top_terms_same
    query = _ids(backend, 30, 1, 16)
    batch = _ids(backend, 200, 16, 128)
    flags = {"sparse": [True] * 16, "normalize": [True] * 16}
    backend.encode(query, sparse=flags["sparse"][:1], normalize=flags["normalize"][:1])  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        backend.encode(query, sparse=flags["sparse"][:1], normalize=flags["normalize"][:1])
        samples.append(time.perf_counter() - t0)
    figures["query16_p50_ms"] = statistics.median(samples) * 1000
    batch_samples = []
    for _ in range(max(1, repeats // 5)):
        t0 = time.perf_counter()
        encoded = backend.encode(batch, **flags)
        batch_samples.append(time.perf_counter() - t0)
    figures["batch16x128_s"] = min(batch_samples)
    figures["batch16x128_texts_per_s"] = 16 / figures["batch16x128_s"]
    figures["peak_rss_after_load_mb"] = load_rss
    figures["peak_rss_mb"] = report.peak_rss_mb()
    np.save(out.with_suffix(".npy"), np.stack([e.dense for e in encoded]))
    out.write_text(json.dumps(figures))


def main() -> None:
    p = report.parser(__doc__.splitlines()[0])
    p.add_argument("--model", choices=["fullsize", "minilm"], default="fullsize")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--one", nargs=2, metavar=("RUNTIME", "QUANTIZE"), help=argparse_suppress())
    p.add_argument("--out", type=Path, help=argparse_suppress())
    args = p.parse_args()
    repeats = 5 if args.quick else 15
    if args.one:
        run_one(args.model, *args.one, args.threads, repeats, args.out)
        return
    env = {**os.environ, **{k: str(args.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    work = Path(tempfile.mkdtemp(prefix="bench-onnx-"))
    try:
        figures = _compare(args, env, work, repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.write(
        f"onnx_{args.model}",
        figures,
        params={
            "model": args.model,
            "threads": args.threads,
            "repeats": repeats,
            "cpus": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0],
        },
    )


def _compare(args, env: dict, work: Path, repeats: int) -> dict:
    figures: dict = {}
    reference = None
    for runtime, quantize in configs():
        name = f"{runtime}_{'fp32' if quantize == 'none' else quantize.replace('-', '_')}"
        out = work / f"{name}.json"
        command = [sys.executable, "-m", "bench.onnx", "--model", args.model, "--threads", str(args.threads),
                   "--one", runtime, quantize, "--out", str(out)] + (["--quick"] if args.quick else [])  # fmt: skip
        subprocess.run(command, check=True, cwd=ROOT, env=env)
        result = json.loads(out.read_text())
        vectors = np.load(out.with_suffix(".npy"))
        if reference is None:
            reference = vectors
        else:
            cosines = (vectors * reference).sum(axis=1)  # both normalized
            result["cosine_vs_torch_min"] = float(cosines.min())
        for key, value in result.items():
            figures[f"{name}.{key}"] = value
    return figures


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
