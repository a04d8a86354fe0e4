"""Tap packing of the Wan VAE decoder's convolution kernel (``causal_conv3x3(..., pack=c)``,
:mod:`ditax.models.vae.wan.conv_tpu_pack`), interpreted: the (time, row) taps' real channels
side by side in one contraction (and with ``cols=`` the column taps' outputs side by side in
the product's lanes) give the unpacked kernel's and XLA's convolution, with every epilogue;
the padded input channels are ignored."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.models.vae.wan import conv_tpu, conv_tpu_pack
from test_wan_vae_fast import _reference   # XLA's convolution and the epilogues, float32


BLOCK_ELEMS, MXU_ROWS = conv_tpu._TARGET_ELEMS, conv_tpu._MXU_ROWS


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    monkeypatch.setattr(conv_tpu, "_TARGET_ELEMS", 2 * 8 * 256)   # 2 rows a block: 3 blocks
    monkeypatch.setattr(conv_tpu, "_MXU_ROWS", 8)                 # products of one row


def _inputs(seed, c, real, cout, kt, frames=2, dtype=jnp.float32):
    """x, cache (padded channels: noise, which packing ignores), w (rows past ``real``:
    noise), b, residual, gamma; and x, cache, w with the padding zeroed."""
    k = jax.random.split(jax.random.key(seed), 6)
    x = jax.random.normal(k[0], (1, frames, 6, 8, c))
    cache = jax.random.normal(k[1], (1, 2, 6, 8, c)) if kt == 3 else None
    w = jax.random.normal(k[2], (kt, 3, 3, c, cout)) / (9 * kt * real) ** 0.5
    b = jax.random.normal(k[3], (cout,))
    res = jax.random.normal(k[4], (1, frames, 6, 8, cout))
    gamma = 1 + 0.3 * jax.random.normal(k[5], (cout,))
    keep = jnp.arange(c) < real
    clean = (x * keep, None if cache is None else cache * keep, w * keep[:, None])
    cast = lambda a: None if a is None else a.astype(dtype)  # noqa: E731
    return ([cast(a) for a in (x, cache, w, b, res, gamma)], [cast(a) for a in clean])


def test_layout_covers_each_real_channel_once():
    for real, kt in ((96, 3), (192, 3), (192, 1), (40, 3), (16, 3)):
        layout = conv_tpu_pack.chunks(real, kt)
        assert len(layout) == conv_tpu_pack.passes(real, kt, True)
        seen = {}
        for j, pieces in enumerate(layout):
            for k, q, d, lo, hi in pieces:
                for lane in range(lo, hi):
                    src = (lane - d) % 128 + 128 * q     # roll(src, d)[lane] = src[lane - d]
                    assert (k, src) not in seen
                    seen[(k, src)] = 128 * j + lane
        assert seen == {(k, i): k * real + i for k in range(3 * kt) for i in range(real)}
    assert [conv_tpu_pack.passes(c, kt, p) for c, kt in ((96, 3), (192, 3), (192, 1))
            for p in (False, True)] == [9, 7, 18, 14, 6, 5]


@pytest.mark.parametrize("epilogue", ["plain", "residual", "act"])
def test_packed_96_channels(epilogue):
    """96 real channels of 128, 3x3x3 with a cache, float32: the unpacked kernel's values."""
    (x, cache, w, b, res, gamma), (xz, cz, wz) = _inputs(1, 128, 96, 128, 3)
    kw = {"plain": {}, "residual": {"residual": res}, "act": {"act": (gamma, 11.0)}}[epilogue]
    got = conv_tpu.causal_conv3x3(x, cache, w, b, pack=96, interpret=True, **kw)
    want = _reference(xz, cz, wz, b, **kw)
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)
    if epilogue == "plain":
        unpacked = conv_tpu.causal_conv3x3(xz, cz, wz, b, interpret=True, **kw)
        np.testing.assert_allclose(got, unpacked, rtol=0, atol=5e-6)


def test_one_contraction_of_whole_channels():
    """``pack`` = C (nothing padded): the taps' whole widths in one contraction."""
    (x, cache, w, b, _, _), _ = _inputs(6, 128, 128, 128, 3, frames=1)
    got = conv_tpu.causal_conv3x3(x, cache, w, b, pack=128, interpret=True)
    np.testing.assert_allclose(got, _reference(x, cache, w, b), rtol=0, atol=5e-5)


def test_packed_192_channels_narrow_and_phases():
    """192 of 256 (pieces split over two chunks) with an act epilogue; conv_out's narrow
    form (3 outputs); the 2-D sub-pixel upsampling form (``phases``)."""
    (x, cache, w, b, _, gamma), (xz, cz, wz) = _inputs(2, 256, 192, 256, 3, frames=1)
    got = conv_tpu.causal_conv3x3(x, cache, w, b, act=(gamma, 16.0), pack=192, interpret=True)
    np.testing.assert_allclose(got, _reference(xz, cz, wz, b, act=(gamma, 16.0)),
                               rtol=0, atol=5e-5)
    (x, cache, w, b, _, _), (xz, cz, wz) = _inputs(3, 128, 96, 3, 3, frames=1)
    got = conv_tpu.causal_conv3x3(x, cache, w, b, pack=96, interpret=True)
    np.testing.assert_allclose(got, _reference(xz, cz, wz, b), rtol=0, atol=5e-5)
    (x, _, w, b, _, _), (xz, _, wz) = _inputs(4, 256, 192, 512, 1, frames=1)
    got = conv_tpu.causal_conv3x3(x, None, w, b, phases=True, pack=192, interpret=True)
    np.testing.assert_allclose(got, conv_tpu.causal_conv3x3(xz, None, wz, b, phases=True,
                                                            interpret=True), rtol=0, atol=5e-6)


@pytest.mark.parametrize("epilogue", ["residual", "act"])
def test_column_taps_side_by_side(epilogue):
    """``cols=192``: the three column taps' 192 outputs in one product's 640 lanes, taken back
    out with lane rolls; the padded output lanes stay zero."""
    (x, cache, w, b, res, gamma), (xz, cz, wz) = _inputs(7, 256, 192, 256, 3, frames=1)
    real = jnp.arange(256) < 192
    w, wz, b, res, gamma = w * real, wz * real, b * real, res * real, gamma * real
    kw = {"residual": {"residual": res}, "act": {"act": (gamma, 16.0)}}[epilogue]
    got = conv_tpu.causal_conv3x3(x, cache, w, b, pack=192, cols=192, interpret=True, **kw)
    np.testing.assert_allclose(got, _reference(xz, cz, wz, b, **kw), rtol=0, atol=5e-5)
    np.testing.assert_array_equal(got[..., 192:], 0)
    assert conv_tpu_pack.saves_columns(192) and not conv_tpu_pack.saves_columns(96)


def test_packed_bfloat16():
    """bf16 operands: the unpacked kernel's outputs up to the summation order's last bit."""
    (x, cache, w, b, res, _), (xz, cz, wz) = _inputs(5, 128, 96, 128, 3, dtype=jnp.bfloat16)
    got = conv_tpu.causal_conv3x3(x, cache, w, b, residual=res, pack=96, interpret=True)
    want = conv_tpu.causal_conv3x3(xz, cz, wz, b, residual=res, interpret=True)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=2 ** -7, atol=2 ** -7)


def test_pack_refused_where_it_does_not_fit():
    x = jnp.zeros((1, 1, 6, 8, 256))
    w = jnp.zeros((1, 3, 3, 256, 128))
    for pack in (100, 300, 0):
        with pytest.raises(ValueError, match=f"pack={pack} does not fit inputs of 256"):
            conv_tpu.causal_conv3x3(x, None, w, jnp.zeros((128,)), pack=pack, interpret=True)
    w4 = jnp.zeros((1, 3, 3, 256, 512))
    for kw in ({"cols": 128}, {"cols": 200, "pack": 256},
               {"cols": 128, "pack": 256, "phases": True}):
        ww = w4 if "phases" in kw else w
        with pytest.raises(ValueError, match=f"cols={kw['cols']} needs pack="):
            conv_tpu.causal_conv3x3(x, None, ww, jnp.zeros(ww.shape[-1:]), interpret=True, **kw)


def test_decoder_layers_pack_where_it_saves_passes(monkeypatch):
    """``FastPath(pack=True)``: a 96-channel causal conv (norm + SiLU fused), a 192-channel
    one (its column taps side by side too) and a 192-channel upsampling conv run packed and
    give the unpacked fast path's values."""
    from flax import nnx

    from ditax.models.vae.wan.layers import CausalConv3d, Conv2d, FastPath, RMSNorm, fast_path

    assert FastPath(pack=True).pack_for(96) == 96
    assert FastPath().pack_for(96) is None
    assert [FastPath(pack=True).cols_for(c) for c in (3, 96, 192, 384)] == [None, None, 192, None]
    conv = CausalConv3d(96, 96, 3, padding=1, dtype=jnp.float32, rngs=nnx.Rngs(0))
    norm = RMSNorm(96, dtype=jnp.float32)
    conv2 = CausalConv3d(192, 192, 3, padding=1, dtype=jnp.float32, rngs=nnx.Rngs(2))
    up = Conv2d(192, 96, 3, 1, ((1, 1), (1, 1)), rngs=nnx.Rngs(1), dtype=jnp.float32)
    out = CausalConv3d(96, 3, 3, padding=1, dtype=jnp.float32, rngs=nnx.Rngs(3))   # conv_out
    k = jax.random.split(jax.random.key(9), 2)
    x = jax.random.normal(k[0], (1, 1, 6, 8, 128)) * (jnp.arange(128) < 96)
    x2 = jax.random.normal(k[1], (1, 1, 6, 8, 256)) * (jnp.arange(256) < 192)
    packed, chunks = [], conv_tpu_pack.chunks
    monkeypatch.setattr(conv_tpu_pack, "chunks",
                        lambda c, kt: packed.append((c, kt)) or chunks(c, kt))
    outs = []
    for pack in (False, True):
        with jax.default_matmul_precision("highest"), fast_path(FastPath(True, pack)):
            outs.append((conv.fused(x, None, act=norm)[0], conv2.fused(x2, None)[0],
                         up.upsampled(x2), out.fused(x, None)[0]))
    # each layer ran the packed kernel but conv_out (narrow: never packed, FastPath.pack_for)
    assert packed == [(96, 3), (192, 3), (192, 1)]
    assert FastPath(pack=True).pack_for(96, narrow=True) is None
    for got, want in zip(outs[1], outs[0]):
        np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)


PADDED = dict(base_dim=96, z_dim=4, dim_mult=(1, 1, 1, 1), num_res_blocks=1,
              temperal_downsample=(False, True, True))   # 96 (and 48) wide: padded to 128


def test_restricted_fast_path_packs_only_where_asked(monkeypatch):
    """``FastPath(only=..., columns=...)`` (the packed decode's bisection,
    ``benchmarks/vae_decode.py --bisect``): ``pack_for`` / ``cols_for`` only for the channel
    counts named, no column taps without ``columns``; the default packs all; a restricted
    path is a different (hashable) static key; a 384 → 192 conv whose input does not pack
    takes no ``cols`` (they need ``pack``) and gives the unpacked values."""
    from flax import nnx

    from ditax.models.vae.wan.layers import CausalConv3d, FastPath, fast_path

    full, only = FastPath(pack=True), FastPath(pack=True, only=[192, 96])
    assert only.only == (96, 192) and only == FastPath(pack=True, only=(192, 96))
    assert len({full, only, FastPath(pack=True, columns=False), FastPath(pack=True)}) == 3
    assert full == FastPath(pack=True, only=None, columns=True)     # the default: unchanged
    assert [only.pack_for(c) for c in (16, 96, 192, 384)] == [None, 96, 192, None]
    assert [only.cols_for(c) for c in (96, 192)] == [None, 192]
    assert FastPath(pack=True, only=(384,)).cols_for(192) is None
    assert FastPath(pack=True, columns=False).cols_for(192) is None
    assert FastPath(pack=True, columns=False).pack_for(192) == 192
    assert FastPath(only=(96,)).pack_for(96) is None and FastPath(only=(96,)).cols_for(192) is None
    conv = CausalConv3d(384, 192, 3, padding=1, dtype=jnp.float32, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (1, 1, 6, 8, 384))
    packed, chunks = [], conv_tpu_pack.chunks
    monkeypatch.setattr(conv_tpu_pack, "chunks",
                        lambda c, kt: packed.append((c, kt)) or chunks(c, kt))
    outs = []
    for path in (FastPath(True), FastPath(True, True, only=(192,))):
        with jax.default_matmul_precision("highest"), fast_path(path):
            outs.append(conv.fused(x, None)[0])
    assert packed == []
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.slow   # 8 s: five decode traces (a diagnosis path)
def test_restricted_paths_trace_their_own_programs(monkeypatch):
    """``decode_chunk`` with a :class:`FastPath` as ``path``: each restriction traces its own
    program (no jit cache hit on another's), packing only the kernels of the widths named
    (the small decoder: 96-wide convs, and 48-wide ones after each upsampling)."""
    from flax import nnx

    from ditax.models.vae.wan import WanVAE, WanVAEConfig
    from ditax.models.vae.wan.chunks import decode_chunk
    from ditax.models.vae.wan.layers import FastPath

    graphdef, state = nnx.split(nnx.eval_shape(
        lambda: WanVAE(WanVAEConfig(**PADDED), rngs=nnx.Rngs(0))))
    seen, kernel = [], conv_tpu.causal_conv3x3
    monkeypatch.setattr(conv_tpu, "causal_conv3x3", lambda *a, **kw: seen.append(
        (kw.get("pack"), kw.get("cols"))) or kernel(*a, **kw))
    z = jax.ShapeDtypeStruct((1, 1, 4, 4, 4), jnp.float32)
    traced = []
    for path in ("interpret-packed", FastPath(True, True, only=(96,)),
                 FastPath(True, True, only=(48,)), FastPath(True, True, columns=False),
                 FastPath(True, True, only=[96])):   # the last: traced already, cached
        seen.clear()
        decode_chunk.eval_shape(graphdef, state, z, None, first=True, path=path)
        traced.append(sorted({p for p, _ in seen}, key=str))
    # None in every list: conv_out (96 → 3, the narrow form) never packs (FastPath.pack_for)
    assert traced == [[48, 96, None], [96, None], [48, None], [48, 96, None], []]


@pytest.mark.slow       # ~40 s interpreted (on top of the fast tier's ~12 s)
def test_packed_decode_equals_plain(monkeypatch):
    """``path="interpret-packed"``: the decoder's TPU program with every kernel packed (96-wide
    levels padded to 128) decodes the plain path's frames (first chunk, then a later one); so
    does a restricted ``FastPath`` (only the 96-wide kernels packed: ``--bisect``'s kind)."""
    from flax import nnx

    from ditax.models.vae.wan import WanVAE, WanVAEConfig
    from ditax.models.vae.wan.layers import FastPath
    from shared_inputs import randomise

    cfg = WanVAEConfig(**PADDED)
    monkeypatch.setattr(conv_tpu, "_TARGET_ELEMS", BLOCK_ELEMS)    # the decoder's own blocks
    monkeypatch.setattr(conv_tpu, "_MXU_ROWS", MXU_ROWS)
    vae = randomise(WanVAE(cfg, rngs=nnx.Rngs(0)), 2)
    z = jax.random.normal(jax.random.key(3), (1, 4, 3, 4, 4), jnp.float32)
    ref = np.asarray(vae.decode(z, path="plain", frames_per_chunk=1))
    got = np.asarray(vae.decode(z, path="interpret-packed"))
    assert got.shape == ref.shape == (1, 3, 9, 32, 32)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
    part = np.asarray(vae.decode(z, path=FastPath(interpret=True, pack=True, only=(96,))))
    np.testing.assert_allclose(part, ref, rtol=0, atol=1e-5)
    np.testing.assert_allclose(part, got, rtol=0, atol=1e-5)
