"""Head-major attention ``[B, N, L, K]`` (what a model's projections write for the TPU kernels)
against the ``[B, L, N, K]`` calls: the same values bit for bit, for the local kernels and
every sequence-parallel path (Ulysses flat / chunked / shard_major, ring, ulysses_ring; flash
and splash inside), with key masks, uneven lengths and a tensor-parallel mesh; gradients
against the jnp reference; the flash kernel on shards that are no block multiple (partial
last blocks, no padding) against zero-padded shards, forward and backward, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.flash import flash_attention_shard_major
from ditax.attention.plan import resolve
from ditax.attention.reference import reference_attention
from ditax.parallel import make_mesh

# the jnp reference, jitted: one program per shape instead of one per eager op
_reference = jax.jit(lambda q, k, v, m: reference_attention(q, k, v, kv_mask=m))


def _t(x):
    """``[B, L, N, K]`` ↔ ``[B, N, L, K]``."""
    return jnp.swapaxes(x, 1, 2)


def _qkv(rng, B, L, N, K, Lk=None, masked=True):
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    Lk = L if Lk is None else Lk
    mask = jnp.asarray(rng.random((B, Lk)) > 0.3) if masked else None
    return f(B, L, N, K), f(B, Lk, N, K), f(B, Lk, N, K), mask


def _both(call, q, k, v, mask):
    """(token-major output, head-major output transposed back), each jitted."""
    bshd = jax.jit(lambda q, k, v, m: call(q, k, v, kv_mask=m))(q, k, v, mask)
    hm = jax.jit(lambda q, k, v, m: call(q, k, v, kv_mask=m, head_major=True))(
        _t(q), _t(k), _t(v), mask)
    return bshd, _t(hm)


@pytest.fixture(scope="module")
def mesh8():
    return make_mesh({"context": 8})


def test_sequence_parallel_head_major_is_bit_identical(rng, mesh8):
    """L=50 over 8 shards (uneven: the sequence is padded, each shard is 7 tokens, blocks of
    8: a partial block per shard on the head-major kernel path), masked keys. flat and
    shard_major (chunked takes shard_major's kernel path) agree with each other and with the
    token-major call (whose modes agree: test_sequence_parallel); ulysses_ring and splash
    inside Ulysses (the chunked exchange) against the reference."""
    q, k, v, mask = _qkv(rng, 1, 50, 8, 32)
    ref = _reference(q, k, v, mask)
    blocks = dict(block_q=8, block_kv=8)

    def head_major(backend, **opts):
        call = resolve(backend, opts, mesh=mesh8)
        o = jax.jit(lambda q, k, v, m: call(q, k, v, kv_mask=m, head_major=True))(
            _t(q), _t(k), _t(v), mask)
        np.testing.assert_allclose(_t(o), ref, atol=3e-6, err_msg=str((backend, opts)))
        return _t(o)

    uly = [head_major("ulysses", local="flash", out_a2a=m, **blocks)   # chunked: as
           for m in ("flat", "shard_major")]                              # shard_major
    bshd = jax.jit(lambda q, k, v, m: resolve("ulysses", dict(local="flash", **blocks),
                                              mesh=mesh8)(q, k, v, kv_mask=m))(q, k, v, mask)
    assert all(jnp.array_equal(o, bshd) for o in uly)
    head_major("ulysses_ring", local="flash", ulysses_shards=2, out_a2a="shard_major",
               **blocks)
    head_major("ulysses", local="splash", out_a2a="chunked")    # the chunked exchange


def test_local_kernels_and_cross_attention_head_major(rng, mesh8):
    """flash (head-major kernel; Lq=37 / Lk=20: partial blocks) and xla (a token-major
    kernel, transposed around) alone, and cross-attention (Lk != Lq) under ulysses."""
    q, k, v, mask = _qkv(rng, 2, 37, 4, 32, Lk=20)
    for backend, opts in (("flash", dict(block_q=16, block_kv=16)), ("xla", {})):
        bshd, hm = _both(resolve(backend, opts), q, k, v, mask)
        if backend == "xla":      # a BSHD kernel, transposed around: XLA may reorder sums
            np.testing.assert_allclose(hm, bshd, atol=1e-6)
        else:
            assert jnp.array_equal(hm, bshd), backend
    q, k, v, mask = _qkv(rng, 2, 36, 8, 32, Lk=12)
    call = resolve("ulysses", dict(local="flash", block_q=8, block_kv=8), mesh=mesh8)
    hm = jax.jit(lambda q, k, v, m: call(q, k, v, kv_mask=m, head_major=True))(
        _t(q), _t(k), _t(v), mask)
    np.testing.assert_allclose(_t(hm), _reference(q, k, v, mask), atol=3e-6)


def test_head_major_ring_gradient_on_a_tensor_parallel_mesh(rng):
    """context=4 × tensor=2 (heads split over tensor), L=45 (shards of 12, partial blocks):
    the head-major ring's value and gradients w.r.t. q, k, v (through the kernel's continued
    partials) against the reference. (Ulysses on this mesh, forward and gradient: the model test
    tests/models/wan/test_attention_layouts.py.)"""
    mesh = make_mesh({"context": 4, "tensor": 2})
    q, k, v, mask = _qkv(rng, 1, 45, 8, 32)
    w = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    ref_loss = lambda q, k, v: jnp.sum(reference_attention(q, k, v, kv_mask=mask) * w)  # noqa
    g_ref = jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2)))(q, k, v)
    call = resolve("ring", dict(local="flash", block_q=8, block_kv=8), mesh=mesh)

    def loss(q, k, v):
        return jnp.sum(_t(call(_t(q), _t(k), _t(v), kv_mask=mask, head_major=True)) * w)

    value, g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)
    np.testing.assert_allclose(value, jax.jit(ref_loss)(q, k, v), rtol=1e-5)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_flash_partial_shards_equal_zero_padded_shards(rng):
    """Shard-major flash on U=2 shards of Lc=13 tokens (keys: 11) with blocks of 8 — each
    shard's last block partial, read past the shard — against the same shards zero-padded to
    16 (keys masked): output, lse and the gradients of q, k, v bit for bit (those of a
    previous partial to float32 rounding), all finite."""
    U, B, N, Lc, Lkc, K = 2, 2, 2, 13, 11, 32
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    q, k, v = f(U, B, N, Lc, K), f(U, B, N, Lkc, K), f(U, B, N, Lkc, K)
    keep = jnp.asarray(rng.random((B, U, Lkc)) > 0.3).at[1].set(False)
    extra = (f(U, B, N, Lc, K), f(U, B, N, Lc))       # a previous partial (a ring step)
    w = jnp.cos(jnp.arange(q.size, dtype=jnp.float32)).reshape(q.shape)

    def pad(x, n, value=0.0):
        return jnp.pad(x, [(0, 0)] * 3 + [(0, n - x.shape[3])] + [(0, 0)] * (x.ndim - 4),
                       constant_values=value)

    def run(padded, q, k, v, *p):
        kk = jnp.pad(keep, ((0, 0), (0, 0), (0, 16 - Lkc))) if padded else keep
        if padded:
            q, k, v = pad(q, 16), pad(k, 16), pad(v, 16)
            p = (pad(p[0], 16), pad(p[1], 16, -jnp.inf)) if p else ()
        o, lse = flash_attention_shard_major(
            q, k, v, kv_keep=kk, block_q=8, block_kv=8, return_lse=True, interpret=True,
            o_prev=p[0] if p else None, lse_prev=p[1] if p else None, whole_blocks=padded)
        o, lse = o[:, :, :, :Lc], lse[..., :Lc]
        s = jnp.sum(o * w) + 0.3 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))
        return s, (o, lse)

    argnums = tuple(range(3 + len(extra)))
    # jitted: one program each instead of one per eager op (the kernel is the same)
    (_, (o1, l1)), g1 = jax.jit(jax.value_and_grad(lambda *a: run(False, *a), argnums,
                                                   has_aux=True))(q, k, v, *extra)
    (_, (o0, l0)), g0 = jax.jit(jax.value_and_grad(lambda *a: run(True, *a), argnums,
                                                   has_aux=True))(q, k, v, *extra)
    assert jnp.array_equal(o1, o0) and jnp.array_equal(l1, l0)
    for i, (a, b) in enumerate(zip(g1, g0)):
        assert bool(jnp.all(jnp.isfinite(a)))
        if i < 3:       # q, k, v: the kernels' own arithmetic, the same tiles
            assert jnp.array_equal(a, b), i
        else:           # the previous partial's: an elementwise jnp pass over other shapes
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
