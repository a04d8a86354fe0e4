"""sage's int8 quantization blocks apart from its tiles (``attention.quant_block``): large
tiles (what makes the compiled kernel fast) keep fine scales, and the tiles a compiled TPU
takes when none is given."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.config import AttentionConfig, check_attention
from ditax.attention.sage import (_blocks, default_tiles, prepare, sage_attention,
                                  sage_xla_attention)
from ditax.attention.tuning import SAGE_TILES
from ditax.errors import ConfigError


def _qk(seed, L=300, N=2, K=64):
    a, b, c = jax.random.split(jax.random.PRNGKey(seed), 3)
    q, k, v = (jax.random.normal(x, (1, N, L, K), jnp.float32) for x in (a, b, c))
    return q, k, v


def test_quantization_inside_large_tiles_is_the_small_tiles_quantization():
    """Tiles of 256 quantized per 128 tokens: the same int8 values and per-token scales as
    tiles of 128 (the tile only changes how they are laid out for the kernel)."""
    q, k, _ = _qk(0)
    keep = jnp.arange(300)[None, None, :] < 290                     # 10 masked keys
    small = prepare(q[None], k[None], keep, 0.125, 128, 128)
    large = prepare(q[None], k[None], keep, 0.125, 256, 256, (128, 128))
    L = 300
    for a, b in zip(small[:2], large[:2]):                          # q8, k8
        np.testing.assert_array_equal(np.asarray(a)[..., :L, :], np.asarray(b)[..., :L, :])
    for a, b in zip(small[2:4], large[2:4]):                        # q_rows, k_rows per token
        np.testing.assert_array_equal(np.asarray(a).reshape(a.shape[:3] + (-1,))[..., :L],
                                      np.asarray(b).reshape(b.shape[:3] + (-1,))[..., :L])
    np.testing.assert_array_equal(np.asarray(small[4]), np.asarray(large[4]))


def test_large_tiles_with_the_default_quant_block_equal_small_tiles():
    q, k, v = _qk(1)
    mask = jnp.arange(300)[None, :] < 280
    kw = dict(kv_mask=mask, head_major=True, interpret=True)
    small = sage_attention(q, k, v, block_q=128, block_kv=128, **kw)
    large = sage_attention(q, k, v, block_q=256, block_kv=256, **kw)
    np.testing.assert_allclose(np.asarray(large), np.asarray(small), atol=2e-6, rtol=2e-6)
    coarse = sage_attention(q, k, v, block_q=256, block_kv=256, quant_block=256, **kw)
    assert float(jnp.max(jnp.abs(coarse - small))) > 1e-4   # a real change of the scales


def test_finer_quant_blocks_bound_an_outliers_damage():
    """One query token 60x larger than the rest: in a 256-token block it crushes every other
    query's int8 resolution, in a 32-token block only its neighbours'."""
    q, k, v = _qk(2, L=256)
    q = q.at[:, :, 7].multiply(60.0)
    s = jnp.einsum("bnqk,bnlk->bnql", q, k) * q.shape[-1] ** -0.5
    exact = jnp.einsum("bnql,bnlk->bnqk", jax.nn.softmax(s, axis=-1), v)

    def err(quant):
        out = sage_xla_attention(q, k, v, block_q=256, block_kv=256, quant_block=quant,
                                 head_major=True)
        return float(jnp.mean(jnp.abs(out - exact)[:, :, 64:]))     # far from the outlier

    assert err(32) < 0.5 * err(256)


def test_tiles_and_blocks_chosen():
    assert default_tiles(True) == SAGE_TILES and default_tiles(False) == (128, 128)
    # compiled, none given: the chip's row, scales per 128 tokens, clipped to the length
    assert _blocks(None, None, 32760, 32760, True) == (1024, 1024, (128, 128))
    assert _blocks(None, None, 300, 300, True) == (384, 384, (128, 128))
    # the old blocks where the tiles are the old default (quant = tile = 128, short lengths)
    assert _blocks(128, 128, 70, 40, False) == (96, 64, (96, 64))
    assert _blocks(128, 128, 500, 500, False) == (128, 128, (128, 128))
    assert _blocks(512, 512, 500, 500, True, 64) == (512, 512, (64, 64))


def test_bad_quant_blocks_are_refused_in_one_line():
    q, k, v = _qk(3, L=64)
    with pytest.raises(ValueError, match=r"block_q=192 is not a multiple of "
                                         r"attention.quant_block=128"):
        sage_xla_attention(q, k, v, block_q=192, head_major=True)
    with pytest.raises(ValueError, match=r"quant_block=0 must be a positive int"):
        sage_xla_attention(q, k, v, quant_block=0, head_major=True)
    with pytest.raises(ConfigError, match=r"attention.quant_block=0 must be >= 1"):
        check_attention(AttentionConfig(backend="sage", quant_block=0))


def test_a_config_whose_tiles_quant_block_does_not_divide_is_refused_before_any_work():
    with pytest.raises(ConfigError, match=r"block_q=256 is not a multiple of "
                                          r"attention.quant_block=100"):
        check_attention(AttentionConfig(backend="sage_xla", block_q=256, quant_block=100))
    # unset tiles: every default (128 interpreted, the chip's 1024 compiled) must take it
    with pytest.raises(ConfigError, match=r"block_q=1024 \(a default tile\) is not a multiple "
                                          r"of attention.quant_block=384"):
        check_attention(AttentionConfig(backend="sage", quant_block=384))
    check_attention(AttentionConfig(backend="sage", quant_block=64))
    check_attention(AttentionConfig(backend="sage", block_q=512, block_kv=512, quant_block=256))
