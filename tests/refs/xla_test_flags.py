"""The XLA flags the suite compiles its CPU programs with: tests/conftest.py sets them for the
test processes, and tests that start processes of their own (CLI runs, multi-host, kill -9,
the GPU script's dry run) pass them on with :func:`xla_flags`.

``JAX_DISABLE_MOST_OPTIMIZATIONS=0`` in the environment runs everything with XLA's defaults.
"""

from __future__ import annotations

import os

# XLA:CPU's elemental IR emitters for fused computations instead of its MLIR fusion emitters.
# The HLO and its fusion decisions are the same (the flag only picks how a fusion is turned into
# LLVM IR); compiling the suite's tiny programs takes ~40% less CPU (one module: 66.7 -> 39.8 s).
# Transcendentals may round differently in the last bit than with the default emitters: the
# parity bars (1e-5 relative and looser) are far above that, and each bit-exact test compares
# two programs compiled the same way.
# And each program's LLVM module compiled whole rather than split into parts for parallel
# compilation: the suite keeps both cores busy with its two workers, so the parts only add
# overhead (the same machine code per kernel; the whole suite took 808 CPU s instead of 944,
# its wall time 422 s instead of 492).
FAST_CPU_CODEGEN = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"


def fast() -> bool:
    """True unless JAX_DISABLE_MOST_OPTIMIZATIONS=0 asks for XLA's default compiler."""
    return os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS", "1") != "0"


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for a process of the suite with ``devices`` fake CPU devices."""
    flags = f"--xla_force_host_platform_device_count={devices}"
    return f"{flags} {FAST_CPU_CODEGEN}" if fast() else flags
