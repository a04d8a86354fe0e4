"""``benchmarks/vae_decode.py``: ``measure`` decodes on the TPU fast path in bf16 (kernels
interpreted on CPU) — its VAE is a bf16 module, so the latents ``compile_decode`` compiles for
are the ones it is called with — on a small Wan-2.1-shaped VAE (96-wide levels padded to 128:
the kernels run) instead of the full-size one (its CPU compile alone takes minutes)."""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.models.vae.wan import WanVAEConfig

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import vae_decode  # noqa: E402

SMALL = WanVAEConfig(base_dim=96, z_dim=4, dim_mult=(1, 1, 1, 1), num_res_blocks=1,
                     temperal_downsample=(False, True, True))


def test_build_vae_is_a_module_of_its_dtype_with_the_float32_draws():
    bf16 = vae_decode.build_vae("bfloat16", config=SMALL)
    wide = vae_decode.build_vae("float32", values="bfloat16", config=SMALL)
    assert bf16.dtype == jnp.bfloat16 and wide.dtype == jnp.float32
    a, b = jax.tree.leaves(nnx.state(bf16)), jax.tree.leaves(nnx.state(wide))
    assert {x.dtype for x in a} == {jnp.dtype(jnp.bfloat16)}
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x.astype(jnp.float32)), np.asarray(y))


@pytest.mark.parametrize("variant", ["fast"])
def test_measure_fast_bf16(variant):
    row = vae_decode.measure(8, 8, 5, "bfloat16", variant, repeats=1, config=SMALL)
    assert row["path"] == "interpret" and row["dtype"] == "bfloat16"
    assert row["value"] > 0 and row["times_s"] and row["programs"] == 2
    assert row["chunk_estimate_bytes"] > 0
    assert row["frames_per_chunk"] == 1 and row["case"] == "8x8x5 bfloat16"
