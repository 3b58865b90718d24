"""The CPU class ONNX Runtime's int8 kernels run on, and the int8 variant each class gets.

ONNX Runtime picks its matrix kernels from CPUID at start. Its u8×s8 kernels differ in how
they add up products:
- with VNNI (AVX-512 VNNI, AVX-VNNI; AMX on top) `vpdpbusd` sums four products straight
  into 32 bits, and on ARM64 `udot`/`sdot` (or widening multiplies) do the same: exact;
- on AVX2 without VNNI `vpmaddubsw` sums each pair of u8×s8 products into 16 bits and
  saturates: 2 × 255 × 127 = 64,770 > 32,767. Weights in 7 bits (|w| ≤ 63) keep every pair
  within 2 × 255 × 63 = 32,130, so the sums are exact again (ONNX Runtime's documented
  `reduce_range`).
The class is read from CPUID as the kernels read it (numpy's runtime dispatch, which also
checks that the OS saves the AVX-512 registers), never from /proc/cpuinfo: under an
emulator or a hypervisor that masks features the two disagree, and the kernels follow
CPUID. numpy reports no AVX-VNNI (the VEX form, on CPUs without AVX-512); such a CPU is
classed x86-avx2, which only costs it the 8-bit variant, never a saturated sum.
"""

from __future__ import annotations

import functools
import importlib
import platform

X86_VNNI = "x86-vnni"
X86_AVX2 = "x86-avx2"
X86 = "x86"  # x86-64 without AVX2
ARM64 = "arm64"
OTHER = "other"
CLASSES = (X86_VNNI, X86_AVX2, X86, ARM64, OTHER)

# Quantization names: "int8" has 8-bit weights (scale absmax/127), "int8-7bit" 7-bit ones
# (absmax/63). Both quantize activations to uint8 per batch at run time.
INT8 = "int8"
INT8_7BIT = "int8-7bit"
INT8_VARIANTS = (INT8, INT8_7BIT)
WEIGHT_BITS = {INT8: 8, INT8_7BIT: 7}

# Classes whose int8 kernels sum u8×s8 products exactly with 8-bit weights. Everything
# else (AVX2 without VNNI, older x86, the unknown) gets 7-bit weights.
EXACT_8BIT = frozenset({X86_VNNI, ARM64})


@functools.cache
def detect() -> str:
    """This process's CPU class, read once."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return ARM64
    if machine not in ("x86_64", "amd64"):
        return OTHER
    features = _cpu_features()
    if features.get("AVX512VNNI") or features.get("AVX512_CLX"):
        return X86_VNNI
    if features.get("AVX2"):
        return X86_AVX2
    return X86


def _cpu_features() -> dict[str, bool]:
    """numpy's dispatch table (CPUID and XGETBV, read at import)."""
    try:
        module = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # numpy < 2
        module = importlib.import_module("numpy.core._multiarray_umath")
    return dict(module.__cpu_features__)


def int8_variant(cpu_class: str) -> str:
    """The int8 quantization whose sums are exact on `cpu_class`."""
    return INT8 if cpu_class in EXACT_8BIT else INT8_7BIT


def runs_exactly(quantization: str, cpu_class: str) -> bool:
    """Whether an export quantized as `quantization` computes exact int8 sums on `cpu_class`."""
    return quantization != INT8 or cpu_class in EXACT_8BIT
