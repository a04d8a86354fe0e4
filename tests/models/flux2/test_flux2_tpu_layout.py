"""FLUX.2-klein-4B's double block at 1024² compiled for a TPU v5e deviceless
(``benchmarks/quant_fusions.py``'s program: one double block with the embedding and head
around it, splash attention): its q / k / v kernels, stored head-major ``[N, D, K]``, are read
as they lie by the head-major dots. Stored ``[D, N·K]``, XLA transposed each of the six
``[3072, 3072]`` kernels in every layer (0.16 ms a kernel by libtpu's cost model; the stacked
loop's per-layer kernel copies). Skips without libtpu."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import jax
import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason=f'libtpu is not installed: pip install "jax[tpu]=={jax.__version__}" '
           f'(deviceless TPU compile)')

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmarks"))


def test_double_block_copies_no_kernel(monkeypatch):
    import quant_fusions

    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    prev = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        text = quant_fusions.block_hlo("flux.2-klein-4b", "double", "bf16")
    finally:
        jax.config.update("jax_disable_most_optimizations", prev)
    rows = quant_fusions.fusions(text)
    # a kernel's or an activation's copy moves >= 2 x 18.9 MB (bf16 [3072, 3072]); the
    # RoPE tables' f32 [4608, 128] (2.4 MB) may be copied
    copies = [r for r in rows if r["kind"] == "copy" and r["mb"] > 20]
    assert not copies, copies
    assert any(r["kind"] == "custom" for r in rows)            # splash ran
