"""The attention tiles table (ditax.attention.tuning) and the flash kernel paths it selects:
a key block walked in compute sub-blocks, backward tiles smaller than the forward's, and keys
masked only where needed (none / each shard's last block / everywhere), each against the jnp
reference in interpret mode, forward and gradients, on fresh random inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ditax
from ditax.attention import tuning
from ditax.attention.flash import flash_attention, flash_attention_shard_major
from ditax.attention.reference import reference_attention


def _qkv(rng, B, Lq, Lk, N, K):
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    return f(B, Lq, N, K), f(B, Lk, N, K), f(B, Lk, N, K)


def _grads(fn, q, k, v):
    w = jnp.cos(jnp.arange(q.size, dtype=jnp.float32)).reshape(q.shape)
    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w), argnums=(0, 1, 2)))(
        q, k, v)


@pytest.mark.parametrize("K,Lq,Lk,masked,head_major", [
    (128, 70, 90, False, False),    # packed layout, partial last blocks: "last"
    (128, 64, 96, True, False),     # packed, a caller's mask: "all"
    (32, 70, 64, False, True),      # head-major, whole key blocks: "none"
    (32, 40, 90, True, True),
])
def test_compute_sub_blocks_and_backward_tiles_match_reference(rng, K, Lq, Lk, masked,
                                                               head_major):
    q, k, v = _qkv(rng, 2, Lq, Lk, 2, K)
    mask = jnp.asarray(rng.random((2, Lk)) > 0.3) if masked else None
    opts = dict(block_q=32, block_kv=64, block_kv_compute=16, block_q_bwd=16, block_kv_bwd=32,
                interpret=True)

    def flash(q, k, v):
        if head_major:
            t = lambda x: jnp.swapaxes(x, 1, 2)   # noqa: E731
            return t(flash_attention(t(q), t(k), t(v), kv_mask=mask, head_major=True, **opts))
        return flash_attention(q, k, v, kv_mask=mask, **opts)

    def ref(q, k, v):
        return reference_attention(q, k, v, kv_mask=mask)

    np.testing.assert_allclose(jax.jit(flash)(q, k, v), ref(q, k, v), atol=3e-6, rtol=1e-5)
    for a, b in zip(_grads(flash, q, k, v), _grads(ref, q, k, v)):
        np.testing.assert_allclose(a, b, atol=3e-5, rtol=1e-4)


def test_shard_major_partial_shards_mask_only_their_last_blocks(rng):
    """Two shards of 40 keys in blocks of 16: each shard's third block is partial ("last"
    masks it, the others run unmasked); equals the reference on the 80 real keys."""
    U, B, N, Lc, K = 2, 1, 2, 40, 32
    x = lambda: jnp.asarray(rng.standard_normal((U, B, N, Lc, K)), jnp.float32)  # noqa: E731
    q, k, v = x(), x(), x()
    o = flash_attention_shard_major(q, k, v, block_q=16, block_kv=16, interpret=True,
                                    whole_blocks=False)
    plain = lambda a: jnp.moveaxis(a, 0, 2).reshape(B, N, U * Lc, K)   # noqa: E731
    bshd = lambda a: jnp.swapaxes(plain(a), 1, 2)   # noqa: E731
    ref = reference_attention(bshd(q), bshd(k), bshd(v))
    np.testing.assert_allclose(jnp.swapaxes(plain(o), 1, 2), ref, atol=3e-6, rtol=1e-5)


def test_generation_names_and_scoped_vmem():
    assert tuning.generation("TPU v5 lite") == "v5e"
    assert tuning.generation("TPU v6 lite") == "v6e"
    assert tuning.generation("TPU v5") == "v5p"
    assert tuning.generation("TPU v4") == "v4"
    assert tuning.generation("cpu") is None
    assert tuning.scoped_vmem_mib("v5e", "") == 16
    assert tuning.scoped_vmem_mib("v6e", "") == 32
    assert tuning.scoped_vmem_mib("v5e", "--xla_tpu_scoped_vmem_limit_kib=98304 --x=1") == 96


def test_raise_scoped_vmem_keeps_a_users_setting(monkeypatch):
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--foo=1")
    assert tuning.raise_scoped_vmem() == "--xla_tpu_scoped_vmem_limit_kib=98304"
    import os

    assert os.environ["LIBTPU_INIT_ARGS"] == "--foo=1 --xla_tpu_scoped_vmem_limit_kib=98304"
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_scoped_vmem_limit_kib=65536")
    assert tuning.raise_scoped_vmem() is None
    assert tuning.row("splash", "TPU v5 lite") == tuning.TABLE[("splash", "v5e", False)]


@pytest.mark.parametrize("L,top,want", [(32760, 2048, 2048), (4608, 2048, 1536),
                                        (75600, 2048, 2048), (512, 4096, 512), (50, 2048, 128)])
def test_fit_block_pads_little(L, top, want):
    b = tuning.fit_block(L, top)
    assert b == want and b % 128 == 0
    assert tuning.round_up(L, b) - L < max(b, 0.02 * L)


@pytest.mark.parametrize("Lq,Lk", [(32760, 32760), (4608, 4608), (4608, 512), (75600, 512),
                                   (300, 300)])
@pytest.mark.parametrize("raised", [True, False])
def test_splash_blocks_nest_as_the_kernel_requires(monkeypatch, Lq, Lk, raised):
    monkeypatch.setenv("LIBTPU_INIT_ARGS",
                       "--xla_tpu_scoped_vmem_limit_kib=98304" if raised else "")
    b = tuning.splash_blocks(Lq, Lk, "TPU v5 lite", {})
    Lq_p, Lk_p = tuning.round_up(Lq, b["block_q"]), tuning.round_up(Lk, b["block_kv"])
    assert Lq_p % b["block_q_bwd"] == 0 and Lk_p % b["block_kv_bwd"] == 0
    assert b["block_kv"] % b["block_kv_compute"] == 0
    row = tuning.row("splash", "TPU v5 lite")
    assert b["block_q"] <= row.block_q and b["block_kv"] <= row.block_kv
    # a given forward block keeps meaning its unset backward one, as before the table
    g = tuning.splash_blocks(Lq, Lk, "TPU v5 lite", {"block_q": 256, "block_kv": 256})
    assert (g["block_q_bwd"], g["block_kv_bwd"], g["block_kv_compute"]) == (256, 256, 256)


def test_vmem_limit_grows_with_blocks_within_the_chip():
    small = tuning.vmem_limit("TPU v5 lite", 256, 256, 128)
    big = tuning.vmem_limit("TPU v5 lite", 2048, 4096, 128, 1024)
    bwd = tuning.vmem_limit("TPU v5 lite", 1024, 1024, 128, backward=True)
    assert small == 16 * tuning.MIB < big <= 96 * tuning.MIB and bwd > small
    assert tuning.vmem_limit("cpu", 2048, 4096, 128) is None


def test_flash_on_a_tpu_takes_the_table_fitted_to_each_call():
    """Traced for a v5e (no TPU needed: the blocks are chosen before lowering): the self-
    attention call's blocks are the row's, the 512-token cross-attention's its length."""
    seen = []
    from ditax.attention import flash

    real = flash._flash_core
    with ditax.target_platform("tpu", device_kind="TPU v5 lite"):
        for Lk in (32760, 512):
            spec = jax.ShapeDtypeStruct((1, 32760, 2, 8), jnp.bfloat16)   # head-major path
            kv = jax.ShapeDtypeStruct((1, Lk, 2, 8), jnp.bfloat16)

            def grab(*a):
                seen.append((a[7], a[8], a[10]))
                return real(*a)

            flash._flash_core = grab
            try:
                jax.eval_shape(lambda q, k: flash_attention(q, k, k), spec, kv)
            finally:
                flash._flash_core = real
    (bq, bkv, tune), (bq2, bkv2, tune2) = seen
    row = tuning.row("flash", "TPU v5 lite")
    assert (bq, bkv, tune.block_kv_compute) == (row.block_q, row.block_kv, row.block_kv_compute)
    assert (bq2, bkv2) == (row.block_q, 512) and tune.vmem_limit > 16 * tuning.MIB
    assert bq % tune.block_q_bwd == 0 and bkv % tune.block_kv_bwd == 0


@pytest.mark.parametrize("L,top,want", [(23400, 2048, 2048), (23400, 4096, 4096),
                                        (32760, 2048, 2048), (4608, 2048, 1536),
                                        (75600, 4096, 3456), (18720, 2048, 1920)])
def test_key_block_keeps_a_real_compute_block(L, top, want):
    """A causal chunk's 23,400 keys (Wan 1.3B 480p, sink + 3 chunks + itself) fit 1,408 =
    11 x 128 keys a block, whose compute block could only be 128: the key block is refitted
    (2,048 with 1,024); lengths whose fitted block has a compute block over 256 keep it."""
    b = tuning.fit_kv_block(L, top, 1024)
    assert b == want and tuning.fit_block(b, 1024, divides=b) > 256
    assert tuning.splash_blocks(4680, 23400, "TPU v5 lite", {})["block_kv_compute"] >= 512
