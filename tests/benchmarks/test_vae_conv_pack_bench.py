"""``benchmarks/vae_conv_pack.py --chip``'s pieces that run without a chip: the variants each
case runs (``packed_unaligned`` where the 104-pixel latent rows made odd products), the
module settings a variant traces under (restored after), and the report of where a packed
kernel's outputs differ from the padded one's."""

from __future__ import annotations

import pathlib
import sys

import jax.numpy as jnp
import numpy as np

from ditax.models.vae.wan import conv_tpu, conv_tpu_pack

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import vae_conv_pack  # noqa: E402


def test_variants_and_their_settings():
    assert vae_conv_pack.variants("res384_104") == ["padded", "packed", "packed_bf16asm",
                                                    "packed_unaligned", "packed_s62"]
    assert vae_conv_pack.variants("res192") == ["padded", "packed", "packed_bf16asm", "cols"]
    # 60x104 at 384 channels: 20-row blocks in 5 packed products of 4 rows (416 pixels); in 4
    # of 5 rows (520 pixels, not a multiple of bf16's 16-row tiles) without the alignment
    assert conv_tpu.sub_rows(20, 104, True) == 4 and conv_tpu.sub_rows(20, 104) == 10
    assert vae_conv_pack.trips("res384_104", "packed") == [5]
    assert vae_conv_pack.trips("res384_104", "packed_unaligned") == [4]
    with vae_conv_pack.applied("packed_s62"):   # session 62's kernel: bf16 assembly, 520
        assert conv_tpu_pack.ASSEMBLY_DTYPE is None and conv_tpu._ROW_ALIGN == 1
        assert conv_tpu.sub_rows(20, 104, True) == 5
    with vae_conv_pack.applied("packed_bf16asm"):
        assert conv_tpu_pack.ASSEMBLY_DTYPE is None and conv_tpu._ROW_ALIGN == 16
    assert conv_tpu_pack.ASSEMBLY_DTYPE == jnp.float32 and conv_tpu._ROW_ALIGN == 16


def test_where_different_names_the_rows_columns_and_channels():
    ref = np.ones((1, 2, 6, 8, 16), np.float32)
    out = ref.copy()
    out[0, 1, 5, 7, 3] += 0.9   # one wrong value: the last row's last pixel, channel 3
    row = vae_conv_pack.where_different(out, ref, 0.05)
    assert row["max_abs_diff"] == np.float32(0.9) and row["bad_share"] > 0
    assert row["bad_frames"]["first"] == [1] and row["bad_rows"]["first"] == [5]
    assert row["bad_cols"] == {"n": 1, "of": 8, "first": [7]}
    assert row["bad_channels"]["first"] == [3]
    assert "bad_rows" not in vae_conv_pack.where_different(ref, ref, 0.05)
