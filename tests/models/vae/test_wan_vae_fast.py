"""Wan VAE decode: chunks of several latent frames and the TPU fast path (Pallas convolution
kernels run in interpret mode, channels padded to 128, sub-pixel upsampling) give the frames of
the one-latent-frame stream on XLA's convolutions (float32, CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from ditax.models.vae.wan import WanVAE, WanVAEConfig, conv_tpu
from ditax.models.vae.wan.chunks import DecodePrograms, chunk_frames
from shared_inputs import randomise

TOL = 1e-5

# 8x spatial / 4x temporal like Wan 2.1, tiny widths (no channel padding, XLA everywhere)
SMALL = dict(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
             temperal_downsample=(False, True, True))
# 96-wide levels (padded to 128 on the fast path) and a 48-wide one (not padded); frames 16 and
# 32 pixels wide take the kernels, narrower levels stay on XLA's convolutions
PADDED = dict(base_dim=96, z_dim=4, dim_mult=(1, 1, 1, 1), num_res_blocks=1,
              temperal_downsample=(False, True, True))


@pytest.fixture(scope="module")
def small():
    return randomise(WanVAE(WanVAEConfig(**SMALL), rngs=nnx.Rngs(0)), 1)


@pytest.fixture(scope="module")
def padded():
    return randomise(WanVAE(WanVAEConfig(**PADDED), rngs=nnx.Rngs(0)), 2)


def _latents(vae, frames, y, x, seed=0):
    return jax.random.normal(jax.random.key(seed), (1, vae.z_dim, frames, y, x), jnp.float32)


@pytest.mark.parametrize("frames", [2, 3, 6])
def test_chunks_of_latent_frames_equal_the_one_frame_stream(small, frames):
    """Any number of latent frames per chunk (the last chunk padded with zero latents) gives
    the frames of one latent frame per chunk."""
    z = _latents(small, frames, 2, 3)
    ref = np.asarray(small.decode(z, path="plain", frames_per_chunk=1))
    assert ref.shape == (1, 3, 1 + 4 * (frames - 1), 16, 24)
    for n in sorted({2, frames - 1, frames + 3}):
        got = np.asarray(small.decode(z, path="plain", frames_per_chunk=n))
        np.testing.assert_allclose(got, ref, rtol=0, atol=TOL, err_msg=f"{n} frames a chunk")


def test_one_latent_frame(small):
    z = _latents(small, 1, 2, 2)
    ref = np.asarray(small.decode(z, path="plain"))
    assert ref.shape == (1, 3, 1, 16, 16)
    np.testing.assert_allclose(small.decode(z, path="plain", frames_per_chunk=4), ref, rtol=0, atol=0)


@pytest.mark.slow       # ~65 s interpreted; the kernels alone are checked in the fast tier
@pytest.mark.parametrize("frames", [3])
def test_fast_path_equals_plain(padded, frames):
    """The TPU program (kernels interpreted) decodes the plain path's frames: three latent
    frames (the first chunk of one, then a later chunk of two: the later-chunk program is the
    same for any count)."""
    z = _latents(padded, frames, 4, 4, seed=frames)
    ref = np.asarray(padded.decode(z, path="plain", frames_per_chunk=1))
    got = np.asarray(padded.decode(z, path="interpret"))
    assert got.shape == ref.shape == (1, 3, 1 + 4 * (frames - 1), 32, 32)
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL)


def test_compiled_programs(small):
    """compile_decode's programs carry their chunking and decode what the jitted steps do."""
    z = _latents(small, 5, 2, 2)
    programs = small.compile_decode(z.shape, frames_per_chunk=3)
    assert isinstance(programs, DecodePrograms) and programs.frames == 2  # 4 later: 2 + 2
    np.testing.assert_allclose(small.decode(z, programs=programs),
                               small.decode(z, frames_per_chunk=1), rtol=0, atol=TOL)
    assert small.compile_decode((1, small.z_dim, 1, 2, 2)).rest is None


def test_chunk_frames():
    assert chunk_frames(20, 480 * 832, fast=True) == 4            # 16 frames of 480x832
    assert chunk_frames(20, 720 * 1280, fast=True) == 1
    assert chunk_frames(20, 480 * 832, fast=False) == 1
    assert chunk_frames(20, 1, fast=False, frames=6) == 5           # 4 chunks of 5, no padding
    assert chunk_frames(7, 1, fast=False, frames=3) == 3            # 3 + 3 + (1 and 2 padding)
    assert chunk_frames(2, 1, fast=False, frames=8) == 2
    assert chunk_frames(0, 1, fast=True) == 1
    with pytest.raises(ValueError, match="frames_per_chunk=0"):
        chunk_frames(3, 1, fast=False, frames=0)


def _reference(x, cache, w, b, act=None, residual=None):
    xc = jnp.concatenate([cache, x], axis=1)
    y = lax.conv_general_dilated(xc, w, (1, 1, 1), [(0, 0), (1, 1), (1, 1)],
                                 dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
                                 precision=lax.Precision.HIGHEST) + b
    if residual is not None:
        y = y + residual
    if act is not None:
        gamma, scale = act
        norm = jnp.sqrt(jnp.sum(y * y, axis=-1, keepdims=True))
        y = jax.nn.silu(y / jnp.maximum(norm, 1e-12) * scale * gamma)
    return y


@pytest.mark.parametrize("frames", [1, 3])
def test_conv_kernel(monkeypatch, frames):
    """The causal 3x3x3 kernel (interpreted) against XLA's convolution: several row blocks
    (halo rows from the neighbours, zeros at the frame's edges), cache frames, epilogues."""
    monkeypatch.setattr(conv_tpu, "_TARGET_ELEMS", 4 * 16 * 128)   # 2 rows a block: 6 blocks
    monkeypatch.setattr(conv_tpu, "_MXU_ROWS", 16)                 # products of one row
    k = jax.random.split(jax.random.key(frames), 6)
    x = jax.random.normal(k[0], (1, frames, 12, 16, 128))
    cache = jax.random.normal(k[1], (1, 2, 12, 16, 128))
    w = jax.random.normal(k[2], (3, 3, 3, 128, 256)) / (27 * 128) ** 0.5
    b = jax.random.normal(k[3], (256,))
    res = jax.random.normal(k[4], (1, frames, 12, 16, 256))
    gamma = 1 + 0.3 * jax.random.normal(k[5], (256,))
    assert conv_tpu.block_rows(12, 16, 256) == 2
    for kw in ({}, {"residual": res}, {"act": (gamma, 16.0)}):
        got = conv_tpu.causal_conv3x3(x, cache, w, b, interpret=True, **kw)
        np.testing.assert_allclose(got, _reference(x, cache, w, b, **kw), rtol=0, atol=5e-5,
                                   err_msg=str(list(kw)))


def test_kernel_shapes():
    assert conv_tpu.supported((1, 4, 480, 832, 128), 128)
    assert conv_tpu.supported((1, 4, 60, 104, 384), 384)           # rows of 104: a relayout
    assert not conv_tpu.supported((1, 4, 60, 100, 384), 384)
    assert not conv_tpu.supported((1, 4, 480, 832, 96), 96)        # unpadded channels
    assert conv_tpu.block_rows(480, 832, 128) == 8
    with pytest.raises(ValueError, match="unsupported shapes"):
        conv_tpu.causal_conv3x3(jnp.zeros((1, 1, 8, 8, 128)), jnp.zeros((1, 1, 8, 8, 128)),
                                jnp.zeros((3, 3, 3, 128, 128)), jnp.zeros((128,)))


def test_narrow_output_and_frame_kernels(monkeypatch):
    """conv_out's 3 channels (computed on 128 lanes), and the 2-D (one time tap) form."""
    monkeypatch.setattr(conv_tpu, "_MXU_ROWS", 32)                 # products of two rows
    k = jax.random.split(jax.random.key(7), 4)
    x = jax.random.normal(k[0], (1, 2, 8, 16, 128))
    cache = jax.random.normal(k[1], (1, 2, 8, 16, 128))
    w = jax.random.normal(k[2], (3, 3, 3, 128, 3)) / (27 * 128) ** 0.5
    b = jax.random.normal(k[3], (3,))
    got = conv_tpu.causal_conv3x3(x, cache, w, b, interpret=True)
    np.testing.assert_allclose(got, _reference(x, cache, w, b), rtol=0, atol=5e-5)
    w2 = w[1:2]
    got = conv_tpu.causal_conv3x3(x, None, w2, b, interpret=True)
    want = lax.conv_general_dilated(x, w2, (1, 1, 1), [(0, 0), (1, 1), (1, 1)],
                                    dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
                                    precision=lax.Precision.HIGHEST) + b
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)


def test_upsampling_conv():
    """Nearest 2x upsampling then a 3x3 conv, as four phases of a conv on the small frame: by
    XLA (fast path, rows not a multiple of 16) and by the kernel (phases written in place);
    the 96 output channels are padded to 128 and sliced back here."""
    from ditax.models.vae.wan.layers import Conv2d, FastPath, fast_path

    conv = randomise(Conv2d(128, 96, 3, 1, ((1, 1), (1, 1)), rngs=nnx.Rngs(3),
                             dtype=jnp.float32), 4)
    for width in (8, 16):
        x = jax.random.normal(jax.random.key(width), (1, 2, 4, width, 128))
        with jax.default_matmul_precision("highest"):
            want = conv(jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3))
            with fast_path(FastPath(interpret=True)):
                got = conv.upsampled(x)
        assert got.shape == (1, 2, 8, 2 * width, 128)
        np.testing.assert_allclose(got[..., :96], want, rtol=0, atol=5e-5)
        np.testing.assert_array_equal(got[..., 96:], 0)


def test_fast_path_needs_a_tpu(small):
    with pytest.raises(ValueError, match="path='fast' runs Pallas TPU kernels"):
        small.decode(_latents(small, 1, 2, 2), path="fast")
    with pytest.raises(ValueError, match="path='nope' is not one of"):
        small.decode(_latents(small, 1, 2, 2), path="nope")


def test_auto_path_follows_where_the_decode_runs(small):
    """``path="auto"`` is decided by the device the parameters are on, not the default
    backend: on a TPU host a VAE placed on the CPU (a CPU mesh) decodes plain (seen on the
    chip: the CPU run took the Pallas path and failed), while with no device to ask the
    build target decides."""
    from ditax.models.vae.wan.chunks import resolve_path
    from ditax.parallel.platform import target_platform

    cpu = jax.devices("cpu")[0]
    with target_platform("tpu"):
        assert resolve_path("auto") == "packed"      # chunks.PACKED_BY_DEFAULT
        assert resolve_path("auto", cpu) == "plain"
        with pytest.raises(ValueError, match="platform is cpu"):
            resolve_path("fast", cpu)
        z = _latents(small, 1, 2, 2)
        want = small.decode(z, path="plain")
        np.testing.assert_array_equal(small.decode(z), want)   # plain, on the CPU


@pytest.mark.slow
def test_fast_path_equals_plain_wan22():
    """The Wan 2.2 decoder (residual levels, 2x2 patches, 12 output channels) on the fast path:
    its 64-wide levels padded, the duplicated shortcuts added to kernel outputs."""
    cfg = WanVAEConfig(base_dim=8, decoder_base_dim=32, z_dim=8, dim_mult=(1, 2, 2, 2),
                       num_res_blocks=1, temperal_downsample=(False, True, True),
                       is_residual=True, patch_size=2, in_channels=12, out_channels=12,
                       scale_factor_spatial=16)
    vae = randomise(WanVAE(cfg, rngs=nnx.Rngs(0)), 5)
    z = _latents(vae, 2, 1, 2)
    ref = np.asarray(vae.decode(z, path="plain"))
    got = np.asarray(vae.decode(z, path="interpret"))
    assert got.shape == ref.shape == (1, 3, 5, 16, 32)
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL)


def test_kernel_products_follow_the_ambient_precision():
    """The Pallas convolution's float32 products run at the precision XLA's convolutions of the
    plain path take (seen on the chip: pinned at HIGHEST, a float32 VAE's fast decode took
    16 s against the plain path's 6.4 s at the bf16 model's default precision); bf16 ones at
    DEFAULT always (Mosaic refuses bf16 operands at HIGHEST)."""
    from ditax.models.vae.wan.conv_tpu import product_precision

    with jax.default_matmul_precision("default"):
        assert product_precision(jnp.float32) == lax.Precision.DEFAULT
    with jax.default_matmul_precision("highest"):
        assert product_precision(jnp.float32) == lax.Precision.HIGHEST
        assert product_precision(jnp.bfloat16) == lax.Precision.DEFAULT
    with jax.default_matmul_precision("float32"):
        assert product_precision(jnp.float32) == lax.Precision.HIGHEST
    with jax.default_matmul_precision("bfloat16"):
        assert product_precision(jnp.float32) == lax.Precision.DEFAULT
