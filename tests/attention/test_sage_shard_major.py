"""The ``sage`` kernel on Ulysses' shard-major path (interpret mode, CPU devices): q read and
the output written ``[U, b, h, Lc, K]``; flat / chunked / shard_major bit-identical (the same
blocks, means and scales per shard), and equal to ``sage_xla`` on the shard-padded sequence."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.plan import resolve
from ditax.attention.sage import sage_xla_attention
from ditax.attention.sequence import plan_sequence_parallel
from ditax.parallel import make_mesh
from sage_inputs import realistic


def _shard_padded(x, U, lc, lc_p):
    """``[B, N, U·lc, K]`` → ``[B, N, U·lc_p, K]``: each shard zero-padded to ``lc_p``."""
    B, N, _, K = x.shape
    x = x.reshape(B, N, U, lc, K)
    return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, lc_p - lc), (0, 0))).reshape(B, N, -1, K)


def test_sage_ulysses_modes_bit_identical_and_equal_sage_xla(rng):
    """L = 28 over 4 shards of 7 tokens, blocks of 8 (a partial block per shard on the
    head-major kernel path, which pads nothing), masked keys, head-major (what Wan's
    projections write): flat and shard_major the same bits."""
    mesh = make_mesh({"context": 4}, jax.devices()[:4])
    B, L, N, K, U = 1, 28, 4, 32, 4
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in realistic(rng, B, L, L, N, K, jnp.float32))
    mask = jnp.asarray(rng.random((B, L)) > 0.2)
    blocks = dict(local="sage", block_q=8, block_kv=8, interpret=True)
    plan = plan_sequence_parallel("ulysses", mesh, q_shape=(B, L, N, K),
                                  options=dict(blocks, out_a2a="chunked"))
    assert plan.kernel_path and "shard-major sage kernel path" in plan.describe()
    calls = {m: resolve("ulysses", dict(blocks, out_a2a=m), mesh=mesh)
             for m in ("flat", "shard_major")}     # chunked runs shard_major's path (above)
    # the reference: sage_xla on one device over the shards padded to whole blocks (8)
    pad = lambda x: _shard_padded(x, U, 7, 8)   # noqa: E731
    m_p = _shard_padded(mask[:, None, :, None], U, 7, 8)[:, 0, :, 0]
    ref = lambda: sage_xla_attention(pad(q), pad(k), pad(v), kv_mask=m_p,   # noqa: E731
                                     head_major=True, block_q=8, block_kv=8)
    flat, shard_major, ref = jax.jit(lambda: tuple(
        calls[m](q, k, v, kv_mask=mask, head_major=True) for m in calls) + (ref(),))()
    assert jnp.array_equal(flat, shard_major)
    ref = ref.reshape(B, N, U, 8, K)[:, :, :, :7].reshape(B, N, L, K)
    np.testing.assert_allclose(shard_major, ref, rtol=1e-5, atol=1e-5)   # float32 rounding


def test_sage_shard_major_refusals():
    """A ring (no in-kernel merge for sage): shard_major refuses naming the fix, chunked
    falls back to the exchange; compiled blocks off the int8 tiling are refused."""
    mesh = make_mesh({"context": 8})
    kw = dict(q_shape=(1, 64, 8, 32))
    with pytest.raises(ValueError, match="no ring merge for sage; use out_a2a='chunked'"):
        plan_sequence_parallel("ulysses_ring", mesh, options=dict(
            local="sage", ulysses_shards=4, out_a2a="shard_major", interpret=True), **kw)
    plan = plan_sequence_parallel("ulysses_ring", mesh, options=dict(
        local="sage", ulysses_shards=4, out_a2a="chunked", interpret=True), **kw)
    assert not plan.kernel_path and "no ring merge" in plan.reasons[0]
    with pytest.raises(ValueError, match="block_q=8 is not a multiple of 32"):
        plan_sequence_parallel("ulysses", mesh, options=dict(
            local="sage", block_q=8, block_kv=32, out_a2a="shard_major", interpret=False), **kw)


needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason=f'libtpu is not installed: pip install "jax[tpu]=={jax.__version__}" '
           f'(deviceless TPU compile)')


@needs_libtpu
def test_sage_shard_major_compiles_for_v6e_with_fewer_copies_than_flat():
    """Deviceless v6e-8, context 8, head-major bf16 (Wan's layout), 408 tokens (shards of 51,
    a partial block of 64 each): shard_major is one Mosaic kernel reading int8 q / k
    ``[U, 1, 1, 64, 128]``, and materialises fewer relayout bytes than flat's exchange."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    import ditax
    from ditax.plan.audit import KERNEL_TARGET, audit
    from ditax.plan.targets import parse_target, topology_devices

    mesh = make_mesh({"context": 8}, topology_devices(parse_target("tpu-v6e-8")))
    x = jax.ShapeDtypeStruct((1, 8, 408, 128), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P(None, None, "context")))
    found = {}
    with ditax.target_platform("tpu"):
        for mode in ("flat", "shard_major"):
            call = resolve("ulysses", dict(local="sage", out_a2a=mode), mesh=mesh)
            hlo = jax.jit(lambda q, k, v: call(q, k, v, head_major=True)).lower(
                x, x, x).compile().as_text()
            kernels = [ln for ln in hlo.splitlines() if KERNEL_TARGET in ln]
            found[mode] = (audit(hlo)["copy_bytes"], kernels)
    copies, kernels = found["shard_major"]
    assert len(kernels) == 1 and kernels[0].count("s8[8,1,1,64,128]") == 2, kernels
    assert copies < found["flat"][0], (copies, found["flat"][0])
