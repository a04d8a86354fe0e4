"""Splash at padded key lengths without a mask (:mod:`ditax.attention.splash_split`,
``padded_keys="split"``; "auto" takes it past a few hundred padded keys): the whole key blocks
under ``FullMask``, the padded last block masked, merged by their log-sum-exps.
Forward equals the reference and the all-masked path, token- and head-major, with its lse;
gradients are the masked kernel's; the split runs exactly when it should. (The Wan 2.1 1.3B
480p shape's deviceless v5e compile: test_splash_split_tpu.py.)"""

import jax
import jax.numpy as jnp
import pytest
from attention_inputs import BF16_TOL, F32_TOL, GRAD_TOL, make_inputs, rel_err

from ditax.attention.reference import reference_attention
from ditax.attention.splash import splash_attention, split_point
from ditax.attention.splash_split import merge


def _splash(**kw):
    kw = {"padded_keys": "split", **kw}
    return lambda q, k, v, **more: splash_attention(q, k, v, block_q=128, block_kv=128,
                                                    interpret=True, **kw, **more)


def _kernels(fn, *args) -> int:
    return str(jax.make_jaxpr(fn)(*args)).count("pallas_call")


def test_split_forward_equals_reference_token_and_head_major_with_lse(rng):
    """Lq 200 / Lk 330, 128 tiles: keys [0, 256) unmasked, the last 74 padded to 128 and
    masked. The output and lse equal the reference's and the all-masked path's."""
    q, _, _, _ = make_inputs(rng, 2, 200, 330, 2, 64, False)
    _, k, v, _ = make_inputs(rng, 2, 330, 330, 2, 64, False)
    q = q * 3.0                            # sharper rows: the two parts' lse differ widely
    split, masked = _splash(), _splash(padded_keys="mask")
    ref, ref_lse = reference_attention(q, k, v, return_lse=True)

    o, lse = jax.jit(lambda q, k, v: split(q, k, v, return_lse=True))(q, k, v)
    o_m, lse_m = jax.jit(lambda q, k, v: masked(q, k, v, return_lse=True))(q, k, v)
    assert lse.shape == ref_lse.shape == (2, 2, 200) and lse.dtype == jnp.float32
    assert rel_err(o, ref) <= F32_TOL and rel_err(o, o_m) <= F32_TOL, rel_err(o, ref)
    assert float(jnp.max(jnp.abs(lse - ref_lse))) <= 1e-4
    assert float(jnp.max(jnp.abs(lse - lse_m))) <= 1e-4

    t = lambda x: jnp.swapaxes(x, 1, 2)   # noqa: E731  [B, L, N, K] <-> [B, N, L, K]
    o_h = jax.jit(lambda q, k, v: split(q, k, v, head_major=True))(t(q), t(k), t(v))
    assert o_h.shape == (2, 2, 200, 64) and rel_err(t(o_h), ref) <= F32_TOL


def test_split_forward_bf16_within_the_bf16_tolerance(rng):
    q, k, v, _ = make_inputs(rng, 1, 330, 330, 2, 64, False, jnp.bfloat16)
    o = jax.jit(_splash())(q, k, v)
    ref = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)))
    assert o.dtype == jnp.bfloat16 and rel_err(o, ref) <= BF16_TOL, rel_err(o, ref)


def test_split_gradients_are_the_masked_kernels(rng):
    """The split has no VJP of its own: the custom_vjp's rules run the masked kernel, so the
    gradients equal the reference's and the all-masked path's, and the differentiated
    program holds the masked forward and its backward only (not the split's unmasked
    prefix kernel)."""
    q, k, v, _ = make_inputs(rng, 1, 330, 330, 2, 64, False)
    ct = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def grads(f):
        return jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * ct), argnums=(0, 1, 2))

    split, masked = _splash(), _splash(padded_keys="mask")
    got, want = jax.jit(grads(split))(q, k, v), grads(reference_attention)(q, k, v)
    same = jax.jit(grads(masked))(q, k, v)
    for name, g, w, s in zip("qkv", got, want, same):
        assert rel_err(g, w) <= GRAD_TOL, (name, rel_err(g, w))
        assert rel_err(g, s) <= 1e-6, (name, rel_err(g, s))
    assert _kernels(grads(split), q, k, v) == _kernels(grads(masked), q, k, v)
    assert "splash_mha_fwd_residuals" not in str(jax.make_jaxpr(grads(split))(q, k, v))


@pytest.mark.parametrize("Lk,options,kernels", [
    (330, {}, 2),                             # 2 whole blocks + a padded one: split
    (330, {"padded_keys": "mask"}, 1),        # turned off
    (330, {"padded_keys": "auto"}, 1),        # auto: 330 keys are too few to pay
    (384, {}, 1),                             # a block multiple: nothing padded
    (100, {}, 1),                             # one (clipped) block only: nothing to split
    (330, {"block_kv": 512}, 1),              # block clipped to 384 > Lk: one block
    (330, {"kv_mask": True}, 1),              # a kv_mask: every block masked anyway
])
def test_split_runs_exactly_when_it_helps(rng, Lk, options, kernels):
    q, k, v, _ = make_inputs(rng, 1, 256, Lk, 2, 64, False)
    options = {"padded_keys": "split", **options}
    if options.pop("kv_mask", False):
        options["kv_mask"] = jnp.ones((1, Lk), bool)
    kw = {"block_q": 128, "block_kv": 128, "interpret": True, **options}
    assert _kernels(lambda q, k, v: splash_attention(q, k, v, **kw), q, k, v) == kernels


def test_split_point_rule():
    assert split_point(32760, 4096) == 28672
    assert split_point(75600, 4096) == 73728


def test_merge_of_disjoint_parts_is_the_whole_and_stable(rng):
    """Partial attentions over keys [0, 50) and [50, 70) merged equal attention over all 70,
    with logits large enough (x40) that exp without the max would overflow float32."""
    q, k, v, _ = make_inputs(rng, 1, 16, 70, 2, 8, False)
    q = q * 40.0
    o1, l1 = reference_attention(q, k[:, :50], v[:, :50], return_lse=True)
    o2, l2 = reference_attention(q, k[:, 50:], v[:, 50:], return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, return_lse=True)
    t = lambda x: jnp.swapaxes(x, 1, 2)   # noqa: E731  merge works on [..., L, K]
    o, lse = merge(t(o1), l1, t(o2), l2)
    assert float(jnp.max(jnp.abs(lse))) > 100.0                  # exp(lse) overflows float32
    assert rel_err(t(o), ref) <= F32_TOL and rel_err(lse, ref_lse) <= F32_TOL
