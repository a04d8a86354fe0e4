"""8-bit attention (``sage`` Pallas kernel, ``sage_xla``): error against float32 exact
attention at realistic statistics, the interpreted kernel against the XLA implementation
(same quantization: equal to float32 rounding) with a key mask, the log-sum-exp of the true
scores (so ring steps merge), the refused gradient, and the kernel compiled deviceless for
v6e (Mosaic custom call, ``s8 × s8 → s32`` MXU matmul). Sequence parallel:
test_sage_sequence.py."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ditax
from ditax.attention.sage import sage_attention, sage_xla_attention
from ditax.errors import AttentionUnavailable
from sage_inputs import exact, frob, realistic


def test_sage_xla_within_1e2_of_float32_attention(rng):
    """bf16 inputs, K = 128, 300 tokens (a partial last block), a key mask: relative error
    (Frobenius) <= 1e-2 against float32 attention on the same values; the lse is that of the
    true scores (smoothing shift added back)."""
    q, k, v = realistic(rng, 1, 300, 300, 1, 128)
    mask = jnp.asarray(np.arange(300)[None] < 270)
    o, lse = jax.jit(lambda *a: sage_xla_attention(*a, kv_mask=mask, return_lse=True))(q, k, v)
    ref, lse_ref = exact(q, k, v, mask)
    assert o.dtype == jnp.bfloat16
    err = frob(o, ref)
    assert err <= 1e-2, err
    assert float(jnp.max(jnp.abs(lse - lse_ref))) <= 0.05


def test_sage_kernel_interpreted_equals_sage_xla_with_key_mask(rng):
    """Cross-attention shapes (Lq=60, Lk=80: partial blocks on both), head-major, bf16
    (``P`` rounded to bf16 for ``P·V``), per-row masks (one row fully masked: zeros, -inf)."""
    q, k, v = realistic(rng, 2, 60, 80, 1, 64)
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    mask = jnp.asarray(np.arange(80)[None] < np.array([[0], [70]]))
    kw = dict(kv_mask=mask, return_lse=True, head_major=True, block_q=64, block_kv=32)
    (o_x, l_x), (o_p, l_p) = jax.jit(lambda q, k, v: (   # one compile for both
        sage_xla_attention(q, k, v, **kw), sage_attention(q, k, v, interpret=True, **kw)))(
        q, k, v)
    np.testing.assert_allclose(np.asarray(o_p, np.float32), np.asarray(o_x, np.float32),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(l_p, l_x, rtol=1e-6, atol=1e-6)
    assert not np.any(np.asarray(o_p[0], np.float32)) and np.all(np.isneginf(l_p[0]))


def test_sage_refuses_gradient(rng):
    q, k, v = realistic(rng, 1, 16, 16, 1, 8, jnp.float32)
    with pytest.raises(AttentionUnavailable, match="'sage' / 'sage_xla' has no gradient"):
        jax.jit(jax.grad(lambda q: sage_xla_attention(q, k, v).sum()))(q)


needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='libtpu is not installed: pip install "jax[tpu]==0.10.2" (deviceless TPU compile)')


@needs_libtpu
@pytest.mark.parametrize("block,L,padded,tile", [(512, 1000, 1024, 512),
                                                 (None, 2000, 2048, 1024)])
def test_sage_kernel_compiles_for_v6e_with_int8_mxu_matmul(block, L, padded, tile):
    """Deviceless v6e: one Mosaic custom call taking the int8 q / k; the kernel's Mosaic
    module (:func:`captured_mosaic_modules`) holds an ``i8 × i8 → i32`` matmul
    for ``Q·Kᵀ`` and a bf16 one for ``P·V``; with no tiles given, the chip's (1024)."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    from ditax.attention.kernels.mosaic import captured_mosaic_modules

    dev = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4").devices[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    x = jax.ShapeDtypeStruct((1, 2, L, 128), jnp.bfloat16, sharding=rep)
    m = jax.ShapeDtypeStruct((1, L), jnp.bool_, sharding=rep)
    with ditax.target_platform("tpu"), captured_mosaic_modules() as modules:
        fn = jax.jit(lambda q, k, v, m: sage_attention(q, k, v, kv_mask=m, head_major=True,
                                                       block_q=block, block_kv=block))
        hlo = fn.lower(x, x, x, m).compile().as_text()
    calls = [ln for ln in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in ln]
    assert len(calls) == 1 and calls[0].count(f"s8[1,1,2,{padded},128]") == 2
    matmuls = [ln for ln in modules[0].splitlines() if "tpu.matmul" in ln]
    t = tile
    assert any(f"vector<{t}x128xi8>, vector<{t}x128xi8>, vector<{t}x{t}xi32>" in ln
               for ln in matmuls), matmuls
    assert any(f"vector<{t}x{t}xbf16>, vector<{t}x128xbf16>" in ln for ln in matmuls)
