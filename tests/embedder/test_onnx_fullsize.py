"""Opt-in (DWSEARCH_FULLSIZE_TESTS=1): bge-m3 at its real shape (568M parameters, random
weights; built once into ~/.cache/dwsearch-bench) exports to int8 ONNX — weights over
2 GB go through ONNX's external data — and keeps the CLS direction of torch's float32.
Needs about 6 GB of memory and a minute or two on 2 cores."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dwsearch.export_onnx import Request, export
from dwsearch_embedder.backends.base import InputType
from dwsearch_embedder.backends.bge_m3 import BgeM3Backend

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.environ.get("DWSEARCH_FULLSIZE_TESTS") != "1", reason="set DWSEARCH_FULLSIZE_TESTS=1"
    ),
]
TEXTS = ["where is my refund?", "退款什么时候到账", "boss, parcel dah sampai ke belum? 我等了三天了 lah"]


def test_fullsize_int8_export_keeps_the_cls_direction(tmp_path):
    from dwsearch_testkit.tiny_models import fullsize_bge_m3_dir

    model = fullsize_bge_m3_dir()
    directory, manifest, exported = export(
        Request(str(model), quantize="int8", cache_dir=tmp_path, threads=2)
    )
    assert exported and manifest["parameters"] > 560_000_000
    assert (directory / "model.onnx").stat().st_size < 700_000_000  # int8: a quarter of float32's 2.27 GB

    def dense(backend: BgeM3Backend) -> np.ndarray:
        prepared = backend.prepare(TEXTS, InputType.QUERY, 8192)
        encoded = backend.encode(prepared, sparse=[True] * len(TEXTS), normalize=[True] * len(TEXTS))
        return np.stack([e.dense for e in encoded])

    onnx = BgeM3Backend(
        str(model), device="cpu", runtime="onnx", quantize="int8", onnx_cache_dir=tmp_path, threads=2
    )
    assert onnx.load().max_input_tokens == 8192
    ours = dense(onnx)
    del onnx
    reference = dense(_torch(model))
    assert (ours * reference).sum(axis=1).min() >= 0.99


def _torch(model: Path) -> BgeM3Backend:
    backend = BgeM3Backend(str(model), device="cpu", runtime="torch", threads=2)
    backend.load()
    return backend
