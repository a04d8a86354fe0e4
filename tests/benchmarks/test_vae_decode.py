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


@pytest.mark.parametrize("variant", ["fast", "packed-nocols@96"])
def test_measure_fast_bf16(variant):
    row = vae_decode.measure(8, 8, 5, "bfloat16", variant, repeats=1, config=SMALL,
                             profile=variant == "fast")
    assert ("profile" in row) == (variant == "fast")   # --profile (device ops: none on a CPU)
    assert isinstance(row.get("profile", {}), dict)
    assert row["path"] == {"fast": "interpret"}.get(variant, "interpret-" + variant)
    assert row["dtype"] == "bfloat16"
    assert row["value"] > 0 and row["times_s"] and row["programs"] == 2
    assert row["chunk_estimate_bytes"] > 0
    assert row["frames_per_chunk"] == 1 and row["case"] == "8x8x5 bfloat16"


def test_bisect_variants_name_restricted_packing():
    """``--bisect``'s variants: the fast path, the packed one, and it restricted to one input
    width each or without the column taps side by side (off a TPU: interpreted)."""
    from ditax.models.vae.wan.layers import FastPath

    names = vae_decode.BISECT.split(",")
    paths = [vae_decode._variant(n)[0] for n in names]
    assert paths[:2] == ["interpret", "interpret-packed"]
    assert paths[2:] == [FastPath(True, True, only=(c,)) for c in (16, 96, 192, 384)] + [
        FastPath(True, True, columns=False)]
    assert [vae_decode._path_name(p) for p in paths[2:]] == ["interpret-" + n for n in names[2:]]
    assert vae_decode._variant("packed-nocols@96+192:2") == (
        FastPath(True, True, only=(96, 192), columns=False), 2)
    for bad in ("packed@x", "packed-cols", "fast@96"):
        with pytest.raises(SystemExit, match="unknown variant"):
            vae_decode._variant(bad)


def test_frame_diffs_place_the_largest_difference():
    """Where frames differ: the largest difference's [frame, row, column, channel], per latent
    frame (frame 0, then 4 frames each): an error in one chunk shows in its entries alone."""
    ref = np.zeros((1, 9, 4, 6, 3), np.float32)
    got = ref.copy()
    got[0, 6, 2, 5, 1] = 0.5
    got[0, 0, 1, 1, 0] = -0.01
    d = vae_decode.frame_diffs(got, ref)
    assert d["max_abs_diff_at"] == [6, 2, 5, 1]
    assert d["max_abs_diff_by_latent"] == [0.01, 0.0, 0.5]
    assert d["share_over_0.1"] == pytest.approx(1 / ref.size)
    assert d["mean_abs_diff"] == pytest.approx(0.51 / ref.size)


def test_bisect_runs_its_variants_against_the_first(monkeypatch, capsys):
    """``--bisect``: one child a variant (faked here), each row compared with the first's
    frames: ``max_abs_diff``, where it lies and per latent frame."""
    import json

    def child(args, variant, out, cache):
        frames = np.zeros((1, 5, 2, 2, 3), np.float32)
        frames[0, 3, 1, 0, 2] = 0.25 * (variant == "packed@96")
        np.save(out, frames)
        return {"variant": variant, "value": 1.0}

    monkeypatch.setattr(vae_decode, "_child", child)
    vae_decode.main(["--bisect", "--frames", "5", "--repeats", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["variant"] for r in rows] == vae_decode.BISECT.split(",")
    assert rows[0]["reference"]
    assert [r["max_abs_diff"] for r in rows[1:]] == [0, 0, 0.25, 0, 0, 0]
    assert rows[3]["max_abs_diff_at"] == [3, 1, 0, 2]
    assert rows[3]["max_abs_diff_by_latent"] == [0.0, 0.25]
