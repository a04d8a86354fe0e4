"""Checks that would have caught session 62's chip result (the packed 480p decode 0.969 away
from the fast path on a v5e, exact interpreted) where the CPU can: the packed and unpacked
kernels under strict interpretation (uninitialised VMEM NaN, eager DMAs, a race detector,
shuffled parallel grid axes), a deliberately unwritten operand chunk caught as NaN, and the
chip probes (:mod:`ditax.models.vae.wan.conv_tpu_probe`) exact interpreted and able to fail."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from ditax.models.vae.wan import conv_tpu, conv_tpu_pack, conv_tpu_probe

SMALL_FILLS = ((16, 3, 8, 2), (96, 3, 8, 1), (192, 1, 16, 1))


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    monkeypatch.setattr(conv_tpu, "_TARGET_ELEMS", 2 * 8 * 256)   # 2 rows a block: 3 blocks
    monkeypatch.setattr(conv_tpu, "_MXU_ROWS", 8)


def _strict(seed=0):
    return pltpu.InterpretParams(uninitialized_memory="nan", detect_races=True,
                                 dma_execution_mode="eager", random_seed=seed)


def _case(c, real, cout, kt, dtype=jnp.bfloat16):
    k = jax.random.split(jax.random.key(c + cout), 5)
    keep = jnp.arange(c) < real
    outs = jnp.arange(cout) < real if cout == c else jnp.ones(cout, bool)
    x = (jax.random.normal(k[0], (1, 2, 6, 8, c)) * keep).astype(dtype)
    cache = (jax.random.normal(k[1], (1, 2, 6, 8, c)) * keep).astype(dtype) if kt == 3 else None
    w = (jax.random.normal(k[2], (kt, 3, 3, c, cout)) / (9 * kt * real) ** 0.5
         * keep[:, None] * outs).astype(dtype)
    b = (jax.random.normal(k[3], (cout,)) * outs).astype(dtype)
    res = (jax.random.normal(k[4], (1, 2, 6, 8, cout)) * outs).astype(dtype)
    return x, cache, w, b, res


def _races_found() -> bool:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    return bool(getattr(getattr(ipc, "races", None), "races_found", False))


@pytest.mark.parametrize("form", ["pack96_residual", "cols192_residual"])
def test_kernels_under_strict_interpretation(form):
    """bf16, the decoder's forms: packed (and cols) equal the unpacked kernel, no NaN from
    uninitialised scratch, no DMA race, with DMAs run eagerly and the parallel grid axes in a
    random order."""
    c, real, cols = {"pack96_residual": (128, 96, None), "cols192_residual": (256, 192, 192)}[form]
    x, cache, w, b, res = _case(c, real, c, 3)
    want = conv_tpu.causal_conv3x3(x, cache, w, b, residual=res, interpret=_strict(1))
    got = conv_tpu.causal_conv3x3(x, cache, w, b, residual=res, pack=real, cols=cols,
                                  interpret=_strict(2))
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert not np.isnan(want).any() and not np.isnan(got).any()
    assert not _races_found()
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2 ** -7)


def test_an_unwritten_operand_chunk_shows_as_nan(monkeypatch):
    """The check above can fail: a fill that leaves the packed operand's last chunk (the lanes
    past ``3 kt c``, zero weights) unwritten gives NaN (uninitialised VMEM x 0), as garbage
    would on a chip."""
    fill = conv_tpu_pack.fill
    monkeypatch.setattr(conv_tpu_pack, "fill", lambda ref, tap, layout: fill(ref, tap, layout[:-1]))
    x, cache, w, b, _ = _case(128, 96, 128, 3)
    got = conv_tpu.causal_conv3x3(x, cache, w, b, pack=96, interpret=_strict())
    assert np.isnan(np.asarray(got, np.float32)).all()


def test_probes_exact_interpreted():
    """Every probe the chip run prints is exact interpreted (so a chip's non-zero is the
    chip's), at small widths; the decoder's shapes are :data:`conv_tpu_probe.FILLS`."""
    rows = conv_tpu_probe.all_rows(interpret=True, fills=SMALL_FILLS)
    assert [r["probe"] for r in rows] == ["roll"] * 3 + ["fill"] * 9 + ["columns"]
    assert {r.get("assembly") for r in rows} == {None, "bfloat16", "float32"}
    for r in rows:
        assert "error" not in r and r["max_abs_diff"] == 0.0 and r["nan"] == 0, r
    assert all(x % 8 == 0 and c in (16, 96, 192, 384) for c, _, x, _ in conv_tpu_probe.FILLS)


def test_probes_catch_a_reversed_roll(monkeypatch):
    """The probes can fail: with packing's lane rolls turned the other way round (``pltpu.roll``
    of the opposite direction), the assembly and the column probes at 96 channels report
    differences. At 192 every roll is by 64 (its own inverse on 128 lanes) and at 384 there
    is none: a flipped roll could not move those."""
    flipped = types.SimpleNamespace(roll=lambda x, s, axis: jnp.roll(x, -s, axis))
    monkeypatch.setattr(conv_tpu_pack, "pltpu", flipped)
    for probe in (conv_tpu_probe.fill(96, 3, 8, jnp.bfloat16, interpret=True),
                  conv_tpu_probe.fill(16, 3, 8, jnp.bfloat16, interpret=True),
                  conv_tpu_probe.columns(96, interpret=True)):
        assert probe["max_abs_diff"] > 0, probe
    for probe in (conv_tpu_probe.fill(192, 3, 8, jnp.float32, interpret=True),
                  conv_tpu_probe.fill(384, 1, 8, jnp.float32, interpret=True),
                  conv_tpu_probe.columns(192, interpret=True)):
        assert probe["max_abs_diff"] == 0.0, probe


def test_float32_and_bf16_assembly_give_the_same_operand(monkeypatch):
    """``ASSEMBLY_DTYPE`` float32 (the default: bf16 taps converted whole, pieces rolled and
    selected in float32, stored in bf16 in 256-lane pairs) and None (session 62's, all in
    bf16): the same packed kernel output and operand, for even and odd chunk counts."""
    assert conv_tpu_pack.ASSEMBLY_DTYPE == jnp.float32
    x, cache, w, b, res = _case(128, 96, 128, 3)
    want = conv_tpu.causal_conv3x3(x, cache, w, b, residual=res, pack=96, interpret=True)
    monkeypatch.setattr(conv_tpu_pack, "ASSEMBLY_DTYPE", None)
    got = conv_tpu.causal_conv3x3(x, cache, w, b, residual=res, pack=96, interpret=True)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    for pack, kt in ((96, 3), (16, 3), (192, 1)):   # 7, 4, 5 chunks: pairs and a last one
        for via in (None, jnp.float32):
            probe = conv_tpu_probe.fill(pack, kt, 8, jnp.bfloat16, interpret=True, assembly=via)
            assert probe["max_abs_diff"] == 0.0, probe
