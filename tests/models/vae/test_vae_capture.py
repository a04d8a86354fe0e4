"""``benchmarks/vae_capture.py`` on the CPU (kernels interpreted): it captures the decoder's
96-wide kernel calls from an eager first chunk, and its float32 reference of a call agrees
with the padded and packed kernels where those are known right (interpreted), so that on the
chip a kernel far from it is the wrong one."""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.models.vae.wan import WanVAEConfig, conv_tpu
from test_wan_vae_fast import _reference   # float32, no roundings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmarks"))
import vae_capture  # noqa: E402

# Wan 2.1's top level (base 96: three resnets of 96 channels, then conv_out 96 -> 3) under one
# 192-wide level: at 8x8 pixels the latent (4x4) is too narrow for the kernel (rows of a
# multiple of 8 pixels), so only the 96-wide level's convolutions take it — each interpreted
# call costs ~1 s; the full-size VAE at 8x24 (the same seven calls) took 53 s, at 64x64 (33
# calls) minutes
SMALL = WanVAEConfig(base_dim=96, z_dim=4, dim_mult=(1, 2), num_res_blocks=2,
                     temperal_downsample=(False,))


@pytest.mark.slow   # 16-38 s interpreted on two shared cores
def test_captures_the_96_wide_calls_and_the_reference_agrees_with_both_kernels():
    rows = list(vae_capture.run(8, 8, "bfloat16", (96,), interpret=True, config=SMALL))
    head, calls = rows[0], rows[1:]
    # the decoder's structure: the top level's num_res_blocks + 1 resnets (conv1 with the norm
    # + SiLU epilogue, conv2 with the residual), then conv_out (narrow: 3 outputs)
    want = [(f"decoder.up_blocks.1.resnets.{i}.conv{j}", epi)
            for i in range(SMALL.num_res_blocks + 1) for j, epi in ((1, "act"), (2, "residual"))]
    want.append(("decoder.conv_out", "narrow"))
    assert head["kind"] == "capture" and head["kept"] == len(want) == 7
    assert [c[1] for c in head["all"]] == [n for n, _ in want]   # nothing else took the kernel
    assert [(r["name"], r["epilogue"]) for r in calls] == want
    for r in calls:
        assert r["pack"] == 96 and r["cols"] is None and r["cin"] == 96
        assert r["decoder_vs_padded"] == 0.0
        assert r["inputs"]["x_pad"] == {"nonzero_share": 0.0, "max_abs": 0.0}
        assert r["inputs"]["cache_max_abs"] == 0.0                  # the first chunk: no cache
        # Kernels and reference take the same bf16 inputs; their products are exact in float32
        # and only the order of the float32 sums differs (~1e-6 relative), so they differ
        # where one of the epilogue's bf16 roundings (y, y + residual, the norm's steps, the
        # sigmoid) falls the other way: one bf16 step, at most 2^-7 of a value (8 significant
        # bits), which a later rounding can at most double: 2^-6 of the largest |reference|
        # (the tool's "ok"; here the largest seen is ~2^-8 of it)
        for k in ("padded_vs_ref", "packed_vs_ref", "packed_vs_padded"):
            assert r[k]["nan"] == 0 and r[k]["ref_nan"] == 0, (r["name"], k)
            assert r[k]["max_abs_diff"] <= vae_capture.OK_SHARE * r["ref_max_abs"], (r["name"], k)
        assert r["ok"] and r["ref_max_abs"] > 0.1


def test_reference_is_the_float32_convolution_and_takes_phases():
    """In float32 (its roundings are none) the reference is the convolution and epilogues of
    the fast path's tests; ``phases`` puts the four output phases where the interpreted
    kernel does."""
    k = jax.random.split(jax.random.key(3), 6)
    x = jax.random.normal(k[0], (1, 1, 8, 8, 128))
    cache = jax.random.normal(k[1], (1, 2, 8, 8, 128))
    w = jax.random.normal(k[2], (3, 3, 3, 128, 128)) / (27 * 128) ** 0.5
    b, res = jax.random.normal(k[3], (128,)), jax.random.normal(k[4], (1, 1, 8, 8, 128))
    gamma = 1 + 0.3 * jax.random.normal(k[5], (128,))
    for kw in ({}, {"residual": res}, {"act": (gamma, 11.0)}):
        np.testing.assert_allclose(vae_capture.reference(x, cache, w, b, **kw),
                                   _reference(x, cache, w, b, **kw), rtol=0, atol=1e-5)
    w4 = (jax.random.normal(k[2], (1, 3, 3, 128, 512)) / 24).astype(jnp.bfloat16)
    xb, b4 = x.astype(jnp.bfloat16), jnp.tile(b, 4).astype(jnp.bfloat16)
    got = conv_tpu.causal_conv3x3(xb, None, w4, b4, phases=True, interpret=True)
    want = vae_capture.reference(xb, None, w4, b4, phases=True)
    assert got.shape == want.shape == (1, 1, 16, 16, 128)
    # one bf16 rounding of the output, the summation order apart: a bf16 step at most
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2 ** -7, atol=2 ** -10)


def test_compiler_options_from_the_command_line():
    assert [vae_capture._option(v) for v in ("false", "True", "7", "NONE")] == [False, True, 7,
                                                                               "NONE"]


@pytest.mark.slow   # 7-15 s interpreted
def test_jitted_calls_are_captured_as_the_program_ran_them():
    """``--jit-calls packed``: the jitted first chunk's own kernel calls (packed, inputs and
    outputs returned by the program) equal the same kernel run alone and the reference."""
    import vae_capture_jit

    from ditax.models.vae.wan.layers import FastPath

    cfg = WanVAEConfig(base_dim=96, z_dim=4, dim_mult=(1, 2), num_res_blocks=0,
                       temperal_downsample=(False,))
    vae = vae_capture.build_vae("bfloat16", config=cfg)
    z = vae_capture.latents(vae, 8, 8, "bfloat16")
    fast = vae_capture.first_chunk(vae, z, FastPath(interpret=True))
    rows = list(vae_capture_jit.jit_calls(vae, z, fast, (96,), True, "packed"))
    assert [r["kind"] for r in rows] == ["jit_call"] * 3 + ["jit_frames"]
    for r in rows[:-1]:   # conv_out (96 -> 3, the narrow kernel) is never packed
        pack = None if r["name"] == "decoder.conv_out" else 96
        assert r["kernel"] == {"pack": pack, "cols": None} and r["ok"], r["name"]
        assert r["program_vs_rerun"]["max_abs_diff"] == 0.0, r["name"]   # interpreted: exact
    # the program's frames against the eager ones: XLA fuses the kernels' neighbours (norms,
    # SiLU) and rounds them to bf16 elsewhere than the eager ops do — bf16 steps of values
    # under 1 (0.003 here), far from session 64's 0.55
    assert rows[-1]["frames_vs_eager_fast"]["max_abs_diff"] < 0.02
