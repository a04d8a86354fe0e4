"""The Pallas flash backward (dq and dk/dv kernels) against jax.grad of plain attention.

Interpret mode on CPU with tiny shapes (the grid runs as a loop of jnp ops), and deviceless
compiles for TPU v6e (libtpu, no TPU attached) that must contain the Mosaic kernels.
"""

import functools
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.kernels.flash_bwd import flash_core_bwd
from ditax.attention.kernels.flash_fwd import Tune, flash_forward_shard_major


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _core(q, k, v, keep, o_prev, lse_prev, scale, bq, bkv, interpret, tune=Tune()):
    return flash_forward_shard_major(q, k, v, keep, o_prev, lse_prev, scale=scale, block_q=bq,
                                     block_kv=bkv, interpret=interpret, tune=tune)


def _core_fwd(q, k, v, keep, o_prev, lse_prev, scale, bq, bkv, interpret, tune=Tune()):
    o, lse = _core(q, k, v, keep, o_prev, lse_prev, scale, bq, bkv, interpret, tune)
    return (o, lse), (q, k, v, keep, o_prev, lse_prev, o, lse)


_core.defvjp(_core_fwd, flash_core_bwd)


def _plain(x):
    """``[U, B, N, Lc, ...]`` → ``[B, N, U*Lc, ...]`` (shard-major token order)."""
    return jnp.moveaxis(x, 0, 2).reshape(*x.shape[1:3], -1, *x.shape[4:])


def _attention(q, k, v, keep, scale):
    """Plain float32 softmax attention, ``[B, N, L, K]``; returns (o, lse ``[B, N, Lq, 1]``).
    Rows with every key masked give o = 0, lse = -inf, and finite gradients."""
    f32 = jnp.float32
    s = jnp.einsum("bnqk,bnlk->bnql", q.astype(f32), k.astype(f32)) * scale
    s = jnp.where(keep[:, None, None, :], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    p = jnp.exp(s - m)
    den = jnp.sum(p, axis=-1, keepdims=True)
    den_safe = jnp.where(den > 0, den, 1.0)
    o = jnp.einsum("bnql,bnlk->bnqk", p / den_safe, v.astype(f32))
    return o, jnp.where(den > 0, jnp.log(den_safe) + m, -jnp.inf)


def _loss(o, lse, w):
    """Scalar touching o and the finite lse, so the lse cotangent (dlse) is exercised
    (0 on fully masked rows: the inf is replaced before the nonlinearity, no 0 * nan)."""
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return jnp.sum(o.astype(jnp.float32) * w) + 0.3 * jnp.sum(lse * jnp.cos(lse))


def _inputs(rng, U, Uk, B, N, Lc, Lkc, K, dtype):
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32).astype(dtype)  # noqa: E731
    keep = rng.random((B, Uk * Lkc)) > 0.3
    keep[:, -5:] = False                    # padded keys at the end
    keep[-1] = False                        # last batch: every row fully masked
    keep = jnp.asarray(keep.reshape(B, Uk, Lkc), jnp.int32)
    return f(U, B, N, Lc, K), f(Uk, B, N, Lkc, K), f(Uk, B, N, Lkc, K), keep


@pytest.mark.parametrize("U,Uk,Lc,Lkc,bq,bkv,dtype", [
    (1, 1, 48, 24, 16, 8, jnp.float32),     # Lq != Lk, several blocks each way
    (2, 2, 16, 24, 8, 8, jnp.float32),      # shard-major: queries and keys over 2 shards
    (2, 1, 16, 32, 16, 16, jnp.bfloat16),   # bf16 into the MXU, float32 accumulation
])
def test_flash_backward_matches_reference_grad(rng, U, Uk, Lc, Lkc, bq, bkv, dtype):
    B, N, K, scale = 2, 2, 64, 0.2
    q, k, v, keep = _inputs(rng, U, Uk, B, N, Lc, Lkc, K, dtype)
    w = jnp.asarray(rng.standard_normal((U, B, N, Lc, K)), jnp.float32)

    def kernel_loss(q, k, v):
        o, lse = _core(q, k, v, keep, None, None, scale, bq, bkv, True)
        return _loss(_plain(o), _plain(lse), _plain(w))

    def ref_loss(q, k, v):
        o, lse = _attention(_plain(q), _plain(k), _plain(v), keep.reshape(B, -1) != 0, scale)
        return _loss(o, lse, _plain(w))

    up = lambda x: x.astype(jnp.float32)  # noqa: E731  (reference sees the same rounded inputs)
    # jitted: one program each instead of one per eager op (the kernels are the same)
    g = jax.jit(jax.grad(kernel_loss, argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2)))(up(q), up(k), up(v))
    for name, a, b in zip("qkv", g, g_ref):
        assert a.dtype == dtype and a.shape == b.shape, name
        a, b = np.asarray(a, np.float32), np.asarray(b)
        assert np.all(a[:, -1] == 0), name      # last batch fully masked: no gradient at all
        if dtype == jnp.float32:
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=name)
        else:
            assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b), name


def test_flash_backward_through_previous_partial(rng):
    """Keys split into A (plain attention, giving o_prev/lse_prev) and B (the kernel continuing
    from it): gradients w.r.t. q and both chunks equal those of attention over A+B."""
    B, N, L, K, scale = 2, 2, 16, 32, 0.25
    q, ka, va, keep_a = _inputs(rng, 1, 1, B, N, L, L, K, jnp.float32)
    _, kb, vb, keep_b = _inputs(rng, 1, 1, B, N, L, L, K, jnp.float32)
    keep_b = keep_b.at[-1].set(1)           # batch 1: A fully masked, B not (w = 0 path)
    w = jnp.asarray(rng.standard_normal((B, N, L, K)), jnp.float32)

    def kernel_loss(q, ka, va, kb, vb):
        o_a, lse_a = _attention(q[0], ka[0], va[0], keep_a[:, 0] != 0, scale)
        o, lse = _core(q, kb, vb, keep_b, o_a[None], lse_a[None], scale, 8, 8, True)
        return _loss(o[0], lse[0], w)

    def ref_loss(q, ka, va, kb, vb):
        cat = lambda a, b: jnp.concatenate([a[0], b[0]], axis=2)  # noqa: E731
        keep = jnp.concatenate([keep_a[:, 0], keep_b[:, 0]], axis=1) != 0
        return _loss(*_attention(q[0], cat(ka, kb), cat(va, vb), keep, scale), w)

    args = (q, ka, va, kb, vb)
    g = jax.jit(jax.grad(kernel_loss, argnums=range(5)))(*args)
    g_ref = jax.jit(jax.grad(ref_loss, argnums=range(5)))(*args)
    for i, (a, b) in enumerate(zip(g, g_ref)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"argument {i}")


# ---------------------------------------------------------------- deviceless TPU compiles

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='libtpu is not installed: pip install "jax[tpu]==0.10.2" (deviceless TPU compile)')


@pytest.fixture(scope="module")
def v6e_device():
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")   # no metadata server on a non-TPU host
    # deviceless compiles only: another process (a second test run, `ditax plan --target`)
    # may hold libtpu's lockfile, which guards a real TPU this machine does not have
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4").devices[0]


def _padded(L, U, block):
    """Shard length and block for ``L`` tokens over ``U`` shards, by the flash padding rule
    (block clipped to the shard length rounded up to 8; shard padded to a block multiple)."""
    Lc = -(-L // U)
    b = min(block, -(-Lc // 8) * 8)
    return -(-Lc // b) * b, b


def _compile(device, L, U, *, block=512, N=2, K=128, bwd_only=False):
    """Compiled HLO text of forward + backward (or the backward alone) for one v6e device,
    under the suite's ``jax_default_matmul_precision="highest"`` (both kernels pin their own
    matmul precision per dtype, which Mosaic needs for bf16 operands)."""
    mesh = jax.sharding.Mesh(np.array([device]), ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    Lc, b = _padded(L, U, block)
    spec = lambda s, dt: jax.ShapeDtypeStruct(s, dt, sharding=rep)  # noqa: E731
    x, keep = spec((U, 1, N, Lc, K), jnp.bfloat16), spec((1, U, Lc), jnp.int32)
    lse = spec((U, 1, N, Lc, 1), jnp.float32)

    if bwd_only:
        def bwd(q, k, v, keep, o, lse, do, dlse):
            return flash_core_bwd(K ** -0.5, b, b, False, Tune(),
                                  (q, k, v, keep, None, None, o, lse), (do, dlse))[:3]

        return jax.jit(bwd).lower(x, x, x, keep, x, lse, x, lse).compile().as_text()

    def grads(q, k, v, keep):   # keep: the padded keys past L are 0 in a real call
        def loss(q, k, v):
            return _loss(*_core(q, k, v, keep, None, None, K ** -0.5, b, b, False), 1.0)

        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    return jax.jit(grads).lower(x, x, x, keep).compile().as_text()


def _kernels(hlo: str) -> int:
    return hlo.count('custom_call_target="tpu_custom_call"')


@needs_libtpu
@pytest.mark.parametrize("L", [405, 1000])
def test_flash_fwd_bwd_compiles_for_v6e(v6e_device, L):
    """Whole-sequence kernels (U = 1): L=405 → one 408 block (clipped); L=1000 → two 512
    blocks with 24 padded keys. Forward + dq + dk/dv are three real Mosaic kernels."""
    assert _kernels(_compile(v6e_device, L, 1)) == 3


@needs_libtpu
def test_flash_bwd_compiles_for_v6e_shard_major_odd_block(v6e_device):
    """L=405 over 4 shards (context 4): Lc = 104, a block that is not a multiple of 128."""
    assert _kernels(_compile(v6e_device, 405, 4, bwd_only=True)) == 2


@needs_libtpu
def test_flash_fwd_bwd_compiles_for_v6e_shard_major_odd_block(v6e_device):
    """The forward's key mask enters as rows ``[B, Uk*nkv, 1, block_kv]``: any multiple of 8
    lowers (the old ``(1, block_kv)`` block over ``[B, 1, U*Lc]`` needed block_kv % 128 == 0)."""
    assert _kernels(_compile(v6e_device, 405, 4)) == 3
