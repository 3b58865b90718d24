"""The int8 check on the other x86 class than this machine's: ONNX Runtime picks its
kernels from CPUID, and Debian's qemu-user emulates a Haswell CPU (AVX2, no AVX-512, no
VNNI), so on a VNNI machine the AVX2 kernels run under it. Exports are made natively (the
weights do not depend on the CPU); the check runs under the emulator: the 7-bit variant
passes there with the thresholds it passes with natively, and the 8-bit one, whose pair
sums saturate AVX2's 16-bit adds, fails — the guard refusing a really broken variant."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dwsearch.export_onnx import Request, export
from dwsearch.modelserver import cpuclass, quantcheck
from dwsearch_testkit.tiny_models import build_tiny_cross_encoder

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    # Under emulation a Python process runs about 20 times slower: ~90 s on a quiet machine.
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        shutil.which("qemu-x86_64") is None or platform.machine() != "x86_64",
        reason="needs Debian's qemu-user on x86-64 (apt-get install qemu-user)",
    ),
]

# The check, as the export runs it, under the emulator. qemu 7.2's AVX2 emulation crashes
# numpy's AVX2 sort kernels (np.unique, which the lexical weights use), so np.unique is
# swapped for a plain one there: which ids are unique does not depend on the CPU.
CHECK = """
import json, sys
from pathlib import Path
import numpy as np

def unique(values, return_inverse=False):
    values = np.asarray(values)
    keys = sorted(set(values.tolist()))
    found = np.array(keys, dtype=values.dtype)
    if not return_inverse:
        return found
    where = {key: i for i, key in enumerate(keys)}
    return found, np.array([where[v] for v in values.tolist()], dtype=np.intp)

np.unique = unique
from dwsearch.modelserver import cpuclass, onnxexport
from dwsearch_embedder.backends.bge_m3 import BgeM3Backend
from dwsearch_reranker.backends.cross_encoder import CrossEncoderBackend
jobs = json.loads(sys.argv[1])
out = {"cpu_class": cpuclass.detect()}
for name, job in jobs.items():
    backend = BgeM3Backend if job["kind"] == "embedder" else CrossEncoderBackend
    spec = backend.export_spec(Path(job["model"]))
    out[name] = {
        variant: onnxexport.check_quantized(spec.probe, Path(job["none"]), Path(job[variant]), {}).to_manifest()
        for variant in ("int8", "int8-7bit")
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tiny_reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-reranker"))


def test_on_avx2_the_7bit_variant_passes_and_the_8bit_one_is_refused(
    tiny_bge_m3_dir, tiny_reranker_dir, tmp_path
):
    if cpuclass.detect() != cpuclass.X86_VNNI:
        pytest.skip("the 8-bit exports (and their own checks) need a VNNI machine to make them")
    jobs: dict[str, dict[str, str]] = {}
    for kind, model in (("embedder", tiny_bge_m3_dir), ("reranker", tiny_reranker_dir)):
        jobs[kind] = {"kind": kind, "model": str(model)}
        for quantize in ("none", cpuclass.INT8, cpuclass.INT8_7BIT):
            directory, manifest, _ = export(
                Request(str(model), kind=kind, quantize=quantize, output=tmp_path / kind / quantize)
            )
            jobs[kind][quantize] = str(directory)
            if quantize != "none":  # natively, both pass
                assert manifest["check"]["passed"], manifest["check"]
    done = subprocess.run(
        ["qemu-x86_64", "-cpu", "Haswell", sys.executable, "-c", CHECK, json.dumps(jobs)],
        capture_output=True, text=True, timeout=840, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    emulated = json.loads(done.stdout.strip().splitlines()[-1])
    assert emulated["cpu_class"] == cpuclass.X86_AVX2
    for kind in jobs:
        seven, eight = emulated[kind][cpuclass.INT8_7BIT], emulated[kind][cpuclass.INT8]
        assert seven["passed"] and seven["cpu_class"] == cpuclass.X86_AVX2, seven
        assert not eight["passed"], eight
    embedder = emulated["embedder"]
    assert (
        embedder["int8"]["dense_cosine_min"]
        < quantcheck.DENSE_COSINE_MIN
        < embedder["int8-7bit"]["dense_cosine_min"]
    )
