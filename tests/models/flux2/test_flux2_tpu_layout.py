"""FLUX.2-klein-4B's single block at 1024² compiled for a TPU v5e deviceless
(``benchmarks/quant_fusions.py``'s program: one single block with the embedding and head
around it, splash attention): with the head-major path no float32 relayout copy of q or k
(token-major, XLA copied each twice around the per-head norm, ~0.24 ms a copy by libtpu's
cost model) and no copy of a ``[S', N, K]`` activation at all (the ``[D, 3D]`` columns of
the fused kernel the head-major dot reads are copied: weights, ~0.7 ms). Skips without libtpu."""

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


def test_single_block_copies_no_activation(monkeypatch):
    import quant_fusions

    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    prev = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        text = quant_fusions.block_hlo("flux.2-klein-4b", "single", "bf16")
    finally:
        jax.config.update("jax_disable_most_optimizations", prev)
    rows = quant_fusions.fusions(text)
    tokens = 4096 + 512                  # 1024² image tokens + the text's
    # an activation's copy moves >= 2 x 28 MB (bf16 [4608, 3072]); the RoPE tables' f32
    # [4608, 128] (2.4 MB) may be copied
    copies = [r for r in rows if r["kind"] == "copy" and f"{tokens}," in r["shape"]
              and r["mb"] > 20]
    assert not copies, copies
    assert any(r["kind"] == "custom" for r in rows)            # splash ran
