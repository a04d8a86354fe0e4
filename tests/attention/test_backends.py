"""Local attention backends vs the reference on fresh random inputs, and the strict refusals.

Tolerances (relative: max |x - ref| / max |ref|): float32 forward 2e-5, float32 gradients
5e-5, bfloat16 forward 2e-2 (vs the float32 reference on the same bf16-rounded inputs).
Splash runs in Pallas interpret mode here, so its cases are few and tiny.
"""

from __future__ import annotations

import functools
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention import AttentionUnavailable, attend, auto_backend
from ditax.attention.reference import reference_attention
from attention_inputs import BF16_TOL, F32_TOL, GRAD_TOL, make_inputs, rel_err


# (B, Lq, Lk, N, K, masked): self- and cross-attention (77 text tokens), lengths that are not
# block multiples, head dims 32/64/128, per-row valid lengths (the last row fully valid).
CASES = {
    "self_L100_K32_mask": (2, 100, 100, 2, 32, True),
    "cross_Lq129_T77_K64_mask": (2, 129, 77, 2, 64, True),
    "self_L256_K128": (1, 256, 256, 2, 128, False),
    "cross_Lq100_T77_K32": (2, 100, 77, 2, 32, False),
}
SPLASH_CASES = ("self_L100_K32_mask", "cross_Lq129_T77_K64_mask", "self_L256_K128")
# Backend options that make the tiny tests exercise several blocks and the padding.
OPTS = {"xla": {}, "blockwise": {"block_kv": 32}, "splash": {"block_q": 128, "block_kv": 128}}


def run(backend, q, k, v, mask, **kw):
    return jax.jit(lambda q, k, v, m: attend(q, k, v, backend=backend, kv_mask=m,
                                             **OPTS[backend], **kw))(q, k, v, mask)


@pytest.mark.parametrize("backend,case", [(b, c) for b in ("xla", "blockwise") for c in CASES]
                         + [("splash", c) for c in SPLASH_CASES])
def test_forward_float32_matches_reference(backend, case, rng):
    q, k, v, mask = make_inputs(rng, *CASES[case])
    ref = reference_attention(q, k, v, kv_mask=mask)
    out = run(backend, q, k, v, mask)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_err(out, ref) <= F32_TOL, (backend, case, rel_err(out, ref))


@pytest.mark.parametrize("backend", ["xla", "blockwise", "splash"])
def test_forward_bfloat16_matches_reference(backend, rng):
    q, k, v, mask = make_inputs(rng, *CASES["cross_Lq129_T77_K64_mask"], dtype=jnp.bfloat16)
    ref = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), kv_mask=mask)
    out = run(backend, q, k, v, mask)
    assert out.dtype == jnp.bfloat16
    assert rel_err(out, ref) <= BF16_TOL, (backend, rel_err(out, ref))


@pytest.mark.parametrize("backend,case", [("xla", "cross_Lq129_T77_K64_mask"),
                                          ("blockwise", "self_L100_K32_mask"),
                                          ("blockwise", "cross_Lq129_T77_K64_mask"),
                                          ("splash", "self_L100_K32_mask")])
def test_gradients_match_reference(backend, case, rng):
    q, k, v, mask = make_inputs(rng, *CASES[case])
    ct = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * ct)

    g_ref = jax.jit(jax.grad(loss(lambda q, k, v: reference_attention(q, k, v, kv_mask=mask)),
                             (0, 1, 2)))(q, k, v)
    g = jax.jit(jax.grad(loss(lambda q, k, v: attend(q, k, v, backend=backend, kv_mask=mask,
                                                     **OPTS[backend])), (0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", g, g_ref):
        assert rel_err(a, b) <= GRAD_TOL, (backend, case, name, rel_err(a, b))


def test_blockwise_lse_and_its_gradient_match_reference(rng):
    """lse (incl. -inf for a row with every key masked) and d/d(q,k,v) of out and lse."""
    from ditax.attention.blockwise import blockwise_attention

    q, k, v, _ = make_inputs(rng, 3, 100, 129, 2, 32, False)
    mask = jnp.asarray(np.arange(129)[None, :] < np.array([[0], [50], [129]]))
    o, lse = jax.jit(functools.partial(blockwise_attention, block_kv=32, return_lse=True))(
        q, k, v, kv_mask=mask)
    o_ref, lse_ref = reference_attention(q, k, v, kv_mask=mask, return_lse=True)
    assert rel_err(o, o_ref) <= F32_TOL
    assert np.all(np.asarray(o[0]) == 0)
    assert np.array_equal(np.isfinite(lse), np.isfinite(lse_ref))
    assert not np.isfinite(np.asarray(lse[0])).any() and np.isfinite(np.asarray(lse[1:])).all()
    assert rel_err(lse[1:], lse_ref[1:]) <= F32_TOL

    ct_o = jnp.asarray(rng.standard_normal(o.shape), jnp.float32)
    ct_l = jnp.asarray(rng.standard_normal(lse.shape), jnp.float32).at[0].set(0.0)

    def loss(fn):
        def f(q, k, v):
            o, lse = fn(q, k, v)
            return jnp.sum(o * ct_o) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * ct_l)
        return f

    g = jax.jit(jax.grad(loss(lambda q, k, v: blockwise_attention(
        q, k, v, kv_mask=mask, block_kv=32, return_lse=True)), (0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(loss(lambda q, k, v: reference_attention(
        q, k, v, kv_mask=mask, return_lse=True)), (0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", g, g_ref):
        assert np.isfinite(np.asarray(a)).all()
        assert rel_err(a, b) <= GRAD_TOL, (name, rel_err(a, b))


def test_splash_lse_padded_head_dim_and_empty_row(rng):
    """Splash with K=32 zero-padded to 128, a fully masked row, a custom scale, and lse."""
    from ditax.attention.splash import splash_attention

    q, k, v, _ = make_inputs(rng, 2, 100, 77, 2, 32, False)
    mask = jnp.asarray(np.arange(77)[None, :] < np.array([[0], [40]]))
    fn = jax.jit(functools.partial(splash_attention, block_q=128, block_kv=128, scale=0.3,
                                   pad_head_dim=True, return_lse=True))
    o, lse = fn(q, k, v, kv_mask=mask)
    o_ref, lse_ref = reference_attention(q, k, v, kv_mask=mask, scale=0.3, return_lse=True)
    assert rel_err(o, o_ref) <= F32_TOL and np.all(np.asarray(o[0]) == 0)
    assert np.array_equal(np.isfinite(lse), np.isfinite(lse_ref))
    assert rel_err(lse[1], lse_ref[1]) <= F32_TOL


@pytest.mark.parametrize("backend", ["xla", "blockwise"])
def test_fully_masked_rows_are_zero(backend, rng):
    q, k, v, _ = make_inputs(rng, 2, 16, 24, 2, 32, False)
    mask = jnp.asarray(np.array([[False] * 24, [True] * 12 + [False] * 12]))
    out = run(backend, q, k, v, mask)
    assert np.all(np.asarray(out[0]) == 0) and np.isfinite(np.asarray(out)).all()
    assert rel_err(out, reference_attention(q, k, v, kv_mask=mask)) <= F32_TOL


def test_blockwise_uses_less_temp_memory_than_xla():
    """At L=4096 the xla path holds [N, L, L] scores; blockwise holds [N, L, block_kv]."""
    from ditax.attention.blockwise import blockwise_attention
    from ditax.attention.xla import xla_attention

    x = jax.ShapeDtypeStruct((1, 4096, 1, 32), jnp.float32)

    def temp(fn):
        return jax.jit(fn).lower(x, x, x).compile().memory_analysis().temp_size_in_bytes

    t_xla = temp(xla_attention)
    t_bw = temp(functools.partial(blockwise_attention, block_kv=256))
    assert t_xla >= 4096 * 4096 * 4  # the score matrix
    assert t_bw * 4 < t_xla, (t_bw, t_xla)


# ---------------------------------------------------------------- strict refusals


@pytest.mark.skipif(jax.devices()[0].platform != "cpu", reason="CPU is not the default here")
@pytest.mark.parametrize("backend", ["cudnn", "te"])
def test_gpu_backends_refuse_without_cuda(backend, rng):
    q, k, v, _ = make_inputs(rng, 1, 8, 8, 2, 64, False, dtype=jnp.bfloat16)
    with pytest.raises(AttentionUnavailable) as e:
        attend(q, k, v, backend=backend)
    msg = str(e.value)
    assert repr(backend) in msg
    assert "no CUDA GPU visible: jax.devices() are cpu" in msg
    assert "install ditax[gpu] on a CUDA machine, or use backend='xla'" in msg


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None,
                    reason="checks the refusal where TransformerEngine is not installed")
def test_te_refuses_without_transformer_engine(rng):
    import ditax

    q, k, v, _ = make_inputs(rng, 1, 8, 8, 2, 64, False, dtype=jnp.bfloat16)
    with ditax.target_platform("cuda", compute_capability=(9, 0)):
        with pytest.raises(AttentionUnavailable,
                           match=r"'te' is unavailable: transformer_engine.jax is not importable; "
                                 r"install ditax\[gpu\] \(transformer-engine"):
            attend(q, k, v, backend="te")


@pytest.mark.parametrize("dtype,K,cc,fragment", [
    (jnp.float32, 64, (9, 0), "got float32"),
    (jnp.bfloat16, 36, (9, 0), "K=36"),
    (jnp.bfloat16, 192, (8, 0), "<= 128"),
    (jnp.float16, 264, (9, 0), "<= 256"),
])
def test_cudnn_input_checks_name_the_value(dtype, K, cc, fragment):
    from ditax.attention.cudnn import check_cudnn_inputs

    q = jnp.zeros((1, 8, 2, K), dtype)
    with pytest.raises(AttentionUnavailable, match=fragment) as e:
        check_cudnn_inputs(q, "cudnn", cc)
    assert "backend='xla'" in str(e.value)


def test_cudnn_input_checks_accept_supported():
    from ditax.attention.cudnn import check_cudnn_inputs

    check_cudnn_inputs(jnp.zeros((1, 8, 2, 128), jnp.bfloat16), "cudnn", (8, 0))
    check_cudnn_inputs(jnp.zeros((1, 8, 2, 256), jnp.float16), "cudnn", (9, 0))


def test_unknown_backend_suggests_a_name(rng):
    q, k, v, _ = make_inputs(rng, 1, 8, 8, 2, 32, False)
    with pytest.raises(ValueError, match=r"unknown attention backend 'splsh'.*did you mean 'splash'"):
        attend(q, k, v, backend="splsh")


def test_option_a_backend_does_not_take_is_an_error(rng):
    q, k, v, _ = make_inputs(rng, 1, 8, 8, 2, 32, False)
    with pytest.raises(TypeError, match=r"'xla' does not take option\(s\) \['block_kv'\]"):
        attend(q, k, v, backend="xla", block_kv=128)
    with pytest.raises(TypeError, match=r"'blockwise' does not take option\(s\) \['block_q'\]"):
        attend(q, k, v, backend="blockwise", block_q=128)


def test_splash_rejects_bad_block(rng):
    q, k, v, _ = make_inputs(rng, 1, 8, 8, 2, 32, False)
    with pytest.raises(ValueError, match="block_kv=100 must be a positive multiple of 128"):
        attend(q, k, v, backend="splash", block_kv=100)


def test_auto_backend_per_platform():
    assert auto_backend("tpu") == "splash"
    assert auto_backend("gpu") == "cudnn"
    assert auto_backend("cpu") == "xla"


def test_splash_refuses_on_a_gpu_target(rng):
    """On a GPU splash would run in Pallas interpret mode: refused, like flash."""
    import ditax

    q, k, v, _ = make_inputs(rng, 1, 8, 8, 2, 64, False, dtype=jnp.bfloat16)
    with ditax.target_platform("cuda", compute_capability=(9, 0)):
        with pytest.raises(AttentionUnavailable, match=r"'splash' is unavailable: splash is the "
                                                       r"Pallas TPU .*backend='cudnn'"):
            attend(q, k, v, backend="splash")
        from ditax.attention.splash import splash_attention

        with pytest.raises(AttentionUnavailable, match="no GPU lowering"):
            splash_attention(q, k, v)
