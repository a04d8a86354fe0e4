"""Splash at padded key lengths without a mask, one unmasked kernel over keys padded with
copies of real keys (:mod:`ditax.attention.splash_duplicate`): forward equals the reference
token- and head-major with its lse, also in rows the copies dominate (their share near 1/2)
and rows where they are negligible; gradients are the masked kernel's; one kernel; the
choice between the padded-keys modes (:func:`ditax.attention.splash.padded_keys_mode`).
(The Wan 2.1 1.3B 480p shape's deviceless v5e compile: test_splash_split_tpu.py.)"""

import jax
import jax.numpy as jnp
import pytest
from attention_inputs import BF16_TOL, F32_TOL, GRAD_TOL, make_inputs, rel_err

from ditax.attention.config import AttentionConfig, check_attention
from ditax.attention.reference import reference_attention
from ditax.attention.splash import padded_keys_mode, splash_attention
from ditax.attention.splash_duplicate import DUPLICATE_MAX, remove_copies
from ditax.errors import ConfigError

LK, N_COPIES = 500, 12          # 128 tiles: keys padded to 512 with copies of keys 0..11


def _splash(**kw):
    return lambda q, k, v, **more: splash_attention(q, k, v, block_q=128, block_kv=128,
                                                    interpret=True, **kw, **more)


def _jaxpr(fn, *args) -> str:
    return str(jax.make_jaxpr(fn)(*args))


def _copies_share(q, k):
    """The copies' share R = D / (Z + D) per query row [B, N, Lq] (reference, float32)."""
    _, lse = reference_attention(q, k, k, return_lse=True)
    _, lse_d = reference_attention(q, k[:, :N_COPIES], k[:, :N_COPIES], return_lse=True)
    return jax.nn.sigmoid(lse_d - lse)


def _dominated_inputs(rng):
    """q rows 0..39 aligned with copied keys (x4: those keys take nearly all the weight, so
    the copies' share nears 1/2), rows 40..79 against them (negligible share), the rest
    random and sharpened."""
    q, _, _, _ = make_inputs(rng, 2, 200, LK, 2, 64, False)
    _, k, v, _ = make_inputs(rng, 2, LK, LK, 2, 64, False)
    copied = k[:, jnp.arange(40) % N_COPIES]                     # [B, 40, N, K]
    away = -8.0 * jnp.mean(k[:, :N_COPIES], axis=1, keepdims=True) + 0.5 * q[:, 40:80]
    q = jnp.concatenate([copied * 4.0, away, q[:, 80:] * 3.0], axis=1)
    return q, k, v


def test_forward_equals_reference_token_and_head_major_with_lse(rng):
    q, k, v = _dominated_inputs(rng)
    share = _copies_share(q, k)
    assert float(jnp.max(share)) > 0.45 and float(jnp.min(share)) < 1e-3   # both regimes
    ref, ref_lse = reference_attention(q, k, v, return_lse=True)
    dup = _splash(padded_keys="duplicate")
    o, lse = jax.jit(lambda q, k, v: dup(q, k, v, return_lse=True))(q, k, v)
    assert lse.shape == ref_lse.shape == (2, 2, 200) and lse.dtype == jnp.float32
    assert rel_err(o, ref) <= F32_TOL, rel_err(o, ref)
    assert float(jnp.max(jnp.abs(lse - ref_lse))) <= 1e-4
    rows = share[0, 0] > 0.45                                     # the dominated rows alone
    assert rel_err(o[0, rows, 0], ref[0, rows, 0]) <= F32_TOL

    t = lambda x: jnp.swapaxes(x, 1, 2)   # noqa: E731  [B, L, N, K] <-> [B, N, L, K]
    o_h, lse_h = jax.jit(lambda q, k, v: dup(q, k, v, head_major=True, return_lse=True))(
        t(q), t(k), t(v))
    assert o_h.shape == (2, 2, 200, 64) and rel_err(t(o_h), ref) <= F32_TOL
    assert float(jnp.max(jnp.abs(lse_h - ref_lse))) <= 1e-4


def test_without_the_correction_the_copies_show(rng):
    """The test above can fail: dropping the correction (the copies counted twice) moves
    the dominated rows far past the tolerance."""
    q, k, v = _dominated_inputs(rng)
    ref = reference_attention(q, k, v)
    kp = jnp.concatenate([k, k[:, :N_COPIES]], axis=1)
    vp = jnp.concatenate([v, jnp.zeros_like(v[:, :N_COPIES])], axis=1)
    assert rel_err(reference_attention(q, kp, vp), ref) > 0.1


def test_remove_copies_is_the_attention_without_them(rng):
    """The correction alone on the reference (head-major [N, L, K]): attention over keys plus
    zero-valued copies of keys 0..n-1, corrected, equals attention over the keys."""
    q, k, v = _dominated_inputs(rng)
    t = lambda x: jnp.swapaxes(x[0], 0, 1) * 1.0   # noqa: E731  [N, L, K]
    qs = t(q) * 64 ** -0.5
    kp = jnp.concatenate([t(k), t(k)[:, :N_COPIES]], axis=1)
    vp = jnp.concatenate([t(v), jnp.zeros_like(t(v)[:, :N_COPIES])], axis=1)
    s = jnp.einsum("nqk,nlk->nql", qs, kp, precision="highest")
    lse = jax.nn.logsumexp(s, axis=-1)
    o = jnp.einsum("nql,nlk->nqk", jnp.exp(s - lse[..., None]), vp, precision="highest")
    o_c, lse_c = remove_copies(o[:, :150], lse, qs, t(k)[:, :N_COPIES])   # the cut, too
    ref, ref_lse = reference_attention(q[:, :150], k, v, return_lse=True)
    assert rel_err(o_c, t(ref)) <= F32_TOL and rel_err(lse_c, ref_lse[0]) <= F32_TOL


def test_forward_bf16_within_the_bf16_tolerance(rng):
    q, k, v = (x.astype(jnp.bfloat16) for x in _dominated_inputs(rng))
    o = jax.jit(_splash(padded_keys="duplicate"))(q, k, v)
    ref = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)))
    assert o.dtype == jnp.bfloat16 and rel_err(o, ref) <= BF16_TOL, rel_err(o, ref)


def test_gradients_are_the_masked_kernels_and_one_kernel_runs(rng):
    """Gradients equal the reference's and the all-masked path's (the custom_vjp's rules
    run the masked kernel; the copies' keys get zero gradient there); the forward is one
    unsegmented pallas_call, the differentiated program holds no residual-saving kernel."""
    q, k, v = _dominated_inputs(rng)
    q = q[:1] * 0.25
    k, v = k[:1], v[:1]
    ct = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def grads(f):
        return jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * ct), argnums=(0, 1, 2))

    dup, masked = _splash(padded_keys="duplicate"), _splash(padded_keys="mask")
    got, want = jax.jit(grads(dup))(q, k, v), grads(reference_attention)(q, k, v)
    same = jax.jit(grads(masked))(q, k, v)
    for name, g, w, s in zip("qkv", got, want, same):
        assert rel_err(g, w) <= GRAD_TOL, (name, rel_err(g, w))
        assert rel_err(g, s) <= 1e-6, (name, rel_err(g, s))
    fwd = _jaxpr(dup, q, k, v)
    assert fwd.count("pallas_call") == 1 and "splash_mha_fwd_residuals" in fwd
    assert "segmented" not in fwd
    assert "segmented" in _jaxpr(_splash(), q, k, v)        # auto: 512 keys mask instead
    assert "splash_mha_fwd_residuals" not in _jaxpr(grads(dup), q, k, v)


def test_unpadded_keys_run_the_unsegmented_kernel(rng):
    """Keys a block multiple, no mask: the kernel without segment ids (its own VJP) unless
    padded_keys="mask"; values and gradients equal the reference's."""
    q, k, v, _ = make_inputs(rng, 1, 200, 384, 2, 64, False)
    run = _splash()
    o, lse = jax.jit(lambda q, k, v: run(q, k, v, return_lse=True))(q, k, v)
    ref, ref_lse = reference_attention(q, k, v, return_lse=True)
    assert rel_err(o, ref) <= F32_TOL and float(jnp.max(jnp.abs(lse - ref_lse))) <= 1e-4
    g = jax.jit(jax.grad(lambda k: jnp.sum(run(q, k, v) ** 2)))(k)
    g_ref = jax.grad(lambda k: jnp.sum(reference_attention(q, k, v) ** 2))(k)
    assert rel_err(g, g_ref) <= GRAD_TOL
    assert "segmented" not in _jaxpr(run, q, k, v)
    assert "segmented" in _jaxpr(_splash(padded_keys="mask"), q, k, v)


@pytest.mark.parametrize("mode,Lk,Lk_p,given,want", [
    ("auto", 32760, 32768, {}, "duplicate"),                 # Wan 480p: 8 copies
    ("auto", 32768, 32768, {}, "full"),                      # nothing padded
    ("auto", 75600, 77824, {}, "split"),                     # Wan 720p: 2,224 padded keys
    ("auto", 16384 - DUPLICATE_MAX, 16384, {}, "duplicate"),  # the most copies auto takes
    ("auto", 16383 - DUPLICATE_MAX, 16384, {}, "split"),      # one more: split
    ("auto", 4095 - DUPLICATE_MAX, 4096, {}, "mask"),        # ... without a whole block
    ("auto", 8184, 8192, {}, "duplicate"),                   # 8 copies pay from ~5,000 keys
    ("auto", 4088, 4096, {}, "mask"),                        # ... not below
    ("auto", 8000, 8192, {}, "mask"),                        # 192 copies need more keys
    ("auto", 10, 128, {}, "mask"),                           # 118 copies: too few keys
    ("duplicate", 100, 128, {}, "duplicate"),                # asked: any count <= Lk
    ("duplicate", 10, 128, {}, "mask"),                      # ... not more
    ("duplicate", 32760, 32768, {"mask": True}, "mask"),     # a kv_mask masks anyway
    ("split", 32760, 32768, {}, "split"),
    ("split", 4000, 4096, {}, "mask"),                       # no whole block to split
    ("mask", 32760, 32768, {}, "mask"),
    ("mask", 32768, 32768, {}, "mask"),
    ("auto", 32760, 32768, {"table": True}, "mask"),         # block-sparse: its own mask
])
def test_padded_keys_mode_rule(mode, Lk, Lk_p, given, want):
    kv_mask = jnp.ones((1, Lk), bool) if given.get("mask") else None
    table = object() if given.get("table") else None
    assert padded_keys_mode(mode, Lk, Lk_p, 4096, kv_mask, table) == want


def test_bad_padded_keys_is_refused_in_one_line(rng):
    q, k, v, _ = make_inputs(rng, 1, 128, 200, 1, 8, False)
    with pytest.raises(ValueError, match=r"^padded_keys='copies' is not one of auto, mask, "
                                         r"split, duplicate$"):
        _splash(padded_keys="copies")(q, k, v)
    with pytest.raises(ConfigError, match=r"attention.padded_keys='dupe' is not one of "
                                          r".*duplicate \(did you mean 'duplicate'\?\)$"):
        check_attention(AttentionConfig(backend="splash", padded_keys="dupe"))
