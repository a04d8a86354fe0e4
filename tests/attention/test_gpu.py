"""The GPU attention backends without a GPU: the numerics of the cuDNN wrapper (lengths, odd
lengths, masks) run on CPU with jax's ``xla`` implementation in place of cuDNN; the
TransformerEngine wrapper runs against a recording stand-in of TE (``te_fake``); ``auto``;
the scoped TE entry context. The ``gpu``-marked tests at the end run on a CUDA GPU
(``pytest -m gpu``). Lowering for CUDA is in ``test_cuda_lowering.py``.
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ditax
import te_fake
from ditax.attention import AttentionConfig, AttentionUnavailable, attend, plan_attention
from ditax.attention.cudnn import length_masked_attention
from ditax.attention.reference import reference_attention
from attention_inputs import BF16_TOL, F32_TOL, GRAD_TOL, make_inputs, rel_err

H100 = dict(compute_capability=(9, 0))


def prefix_mask(lengths, Lk):
    return jnp.asarray(np.arange(Lk)[None, :] < np.asarray(lengths)[:, None])


# (B, Lq, Lk, key lengths or None): odd / even, self / cross (77 text tokens), a row with no
# valid key, lengths that are not multiples of 64.
WRAPPER_CASES = {
    "self_L99_nomask": (2, 99, 99, None),
    "self_L99_mask": (3, 99, 99, (99, 40, 0)),
    "cross_Lq129_T77_mask": (3, 129, 77, (77, 5, 1)),
    "cross_Lq128_T512_mask": (2, 128, 512, (512, 77)),
    "even_L64": (1, 64, 64, None),
}


@pytest.mark.parametrize("case", list(WRAPPER_CASES))
def test_cudnn_wrapper_matches_reference_fwd_and_grad(case, rng):
    """The cuDNN adaptation (padding to even lengths, mask → lengths, empty rows) with the
    xla implementation standing in for cuDNN, forward and gradient, float32."""
    B, Lq, Lk, lens = WRAPPER_CASES[case]
    q, k, v, _ = make_inputs(rng, B, Lq, Lk, 2, 32, False)
    mask = None if lens is None else prefix_mask(lens, Lk)
    ct = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def wrapped(q, k, v):
        return length_masked_attention(q, k, v, kv_mask=mask, implementation="xla")

    def ref(q, k, v):
        return reference_attention(q, k, v, kv_mask=mask)

    out = jax.jit(wrapped)(q, k, v)
    assert out.shape == q.shape and np.isfinite(np.asarray(out)).all()
    assert rel_err(out, ref(q, k, v)) <= F32_TOL
    if lens is not None and 0 in lens:
        assert np.all(np.asarray(out[list(lens).index(0)]) == 0)

    def grads(fn):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) * ct), (0, 1, 2)))(q, k, v)

    for name, a, b in zip("qkv", grads(wrapped), grads(ref)):
        assert np.isfinite(np.asarray(a)).all()
        assert rel_err(a, b) <= GRAD_TOL, (case, name, rel_err(a, b))


def test_cudnn_wrapper_bfloat16(rng):
    q, k, v, _ = make_inputs(rng, 2, 101, 77, 2, 64, False, dtype=jnp.bfloat16)
    mask = prefix_mask((77, 13), 77)
    out = jax.jit(lambda q, k, v: length_masked_attention(q, k, v, kv_mask=mask,
                                                          implementation="xla"))(q, k, v)
    ref = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), kv_mask=mask)
    assert out.dtype == jnp.bfloat16 and rel_err(out, ref) <= BF16_TOL


def test_non_prefix_mask_refused_when_concrete_nan_when_traced(rng):
    """Lengths cannot express a mask with a hole: a concrete one is refused naming the row;
    a traced one turns that row's output into NaN (the other rows stay right)."""
    q, k, v, _ = make_inputs(rng, 2, 10, 12, 2, 32, False)
    mask = np.ones((2, 12), bool)
    mask[1, 3] = False
    with pytest.raises(AttentionUnavailable, match=r"'cudnn' takes key masks as sequence lengths"
                                                   r".*row 1 is not a prefix.*first masked key 3"):
        length_masked_attention(q, k, v, kv_mask=jnp.asarray(mask), implementation="xla")
    out = jax.jit(lambda q, k, v, m: length_masked_attention(q, k, v, kv_mask=m,
                                                             implementation="xla"))(
        q, k, v, jnp.asarray(mask))
    assert np.isnan(np.asarray(out[1])).all()
    assert rel_err(out[0], reference_attention(q, k, v)[0]) <= F32_TOL


def test_cudnn_refuses_off_cuda_and_float32(rng):
    q, k, v, _ = make_inputs(rng, 1, 8, 8, 2, 64, False)
    with ditax.target_platform("cuda", **H100):
        with pytest.raises(AttentionUnavailable, match="got float32"):
            attend(q, k, v, backend="cudnn")
    with pytest.raises(TypeError, match=r"'cudnn' does not take option\(s\) \['kv_mask_mode'\]"):
        attend(q, k, v, backend="cudnn", kv_mask_mode="bias")


# ---------------------------------------------------------------- auto


def test_auto_is_dtype_and_head_dim_aware_and_logged_once(caplog):
    from ditax.attention import registry

    registry._logged.clear()
    with caplog.at_level(logging.INFO, logger="ditax.attention.registry"):
        with ditax.target_platform("cuda", **H100):
            assert plan_attention(AttentionConfig(backend="auto"), head_dim=128,
                                  dtype="bfloat16").self_attn.backend == "cudnn"
            for _ in range(2):
                plan = plan_attention(AttentionConfig(backend="auto"), head_dim=128,
                                      dtype="float32")
                assert plan.self_attn.backend == "blockwise"
                assert plan.cross_attn.backend == "blockwise"
            assert plan_attention(AttentionConfig(backend="auto"), head_dim=36,
                                  dtype="bfloat16").self_attn.backend == "blockwise"
            q = jnp.zeros((1, 8, 2, 32), jnp.float32)
            assert jax.eval_shape(lambda q: attend(q, q, q, backend="auto"), q).shape == q.shape
    lines = [r.getMessage() for r in caplog.records if "backend=auto" in r.getMessage()]
    assert sum("float32, K=128) -> blockwise" in m and "got float32" in m for m in lines) == 1
    assert any("bfloat16, K=128) -> cudnn" in m for m in lines)
    assert any("K=36) -> blockwise" in m and "K=36" in m for m in lines)


# ---------------------------------------------------------------- TransformerEngine


@pytest.fixture
def fake_te(monkeypatch):
    from ditax.attention import platform

    monkeypatch.delenv("NVTE_FUSED_ATTN", raising=False)
    calls = te_fake.install(monkeypatch)
    yield calls
    platform.module_available.cache_clear()


def test_te_calls_the_public_api_with_a_sequence_descriptor(fake_te, rng):
    """No dtype=, BSHD, scale; lengths through SequenceDescriptor.from_seqlens (also without
    a mask); the 4th positional argument is the descriptor; numerics follow the lengths."""
    from ditax.attention.te import configure_te

    q, k, v, _ = make_inputs(rng, 3, 33, 77, 2, 64, False, dtype=jnp.bfloat16)
    mask = prefix_mask((77, 20, 0), 77)
    ref = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), kv_mask=mask)
    with ditax.target_platform("cuda", **H100), configure_te(None):
        out = attend(q, k, v, backend="te", kv_mask=mask)
        plain = attend(q, k, v, backend="te", scale=0.2)
    assert rel_err(out, ref) <= BF16_TOL and np.all(np.asarray(out[2]) == 0)
    masked, unmasked = fake_te
    assert masked["kwargs"] == dict(head_dim=64, num_attention_heads=2, num_gqa_groups=2,
                                    attention_dropout=0.0, attn_mask_type="padding",
                                    qkv_layout="bshd_bshd_bshd", transpose_batch_sequence=False,
                                    scale_factor=0.125)
    assert masked["mask"] is None and masked["bias"] is None and masked["variables"] == {}
    assert masked["deterministic"] is False
    q_len, kv_len = masked["descriptor"].seqlens
    assert q_len.tolist() == [33] * 3 and kv_len.tolist() == [77, 20, 1]
    assert unmasked["kwargs"]["attn_mask_type"] == "no_mask"
    assert unmasked["kwargs"]["scale_factor"] == pytest.approx(0.2)
    assert unmasked["descriptor"].seqlens[1].tolist() == [77] * 3
    ref_plain = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), scale=0.2)
    assert rel_err(plain, ref_plain) <= BF16_TOL


def test_te_refusals(fake_te, rng, monkeypatch):
    from ditax.attention.te import configure_te

    q, k, v, _ = make_inputs(rng, 1, 8, 8, 2, 64, False, dtype=jnp.bfloat16)
    with ditax.target_platform("cuda", **H100):
        with pytest.raises(AttentionUnavailable, match="MeshResource is not set; wrap the run "
                                                       "in ditax.attention.te.configure_te"):
            attend(q, k, v, backend="te")
        with configure_te(None):
            monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
            with pytest.raises(AttentionUnavailable, match="NVTE_FUSED_ATTN=0 is set"):
                attend(q, k, v, backend="te")
            monkeypatch.delenv("NVTE_FUSED_ATTN")

            def falls_back(self, *a, **kw):
                import warnings
                warnings.warn("Fused attention is not enabled because there is no available "
                              "kernel.\nFall back to the unfused attention.")
                return a[1]

            monkeypatch.setattr(te_fake.DotProductAttention, "apply", falls_back)
            with pytest.raises(AttentionUnavailable, match="no fused kernel for q"):
                attend(q, k, v, backend="te")


def _process_state():
    return dict(os.environ), dict(jax.config.values)


def test_te_entry_context_leaves_no_process_wide_state(fake_te, monkeypatch):
    """Only TE's own scoped MeshResource guard: no environment variable and no jax config
    is changed inside or after the block (also when it raises)."""
    from ditax.attention import te
    from ditax.attention.plan import entry_context, needs_entry_context
    from ditax.parallel import make_mesh

    mesh = make_mesh({"fsdp": 2, "context": 4})
    assert te.te_mesh_resource_kwargs(mesh) == {"fsdp_resource": "fsdp",
                                                 "cp_resource": "context"}
    said = []
    before = _process_state()
    with entry_context(AttentionConfig(backend="xla"), mesh, say=said.append):
        assert te_fake._RESOURCE[0] is None
    assert said == []
    with pytest.raises(RuntimeError, match="boom"):
        with entry_context(AttentionConfig(backend="ring", local="te"), mesh,
                           say=said.append):
            assert te_fake.global_mesh_resource().cp_resource == "context"
            assert _process_state() == before
            raise RuntimeError("boom")
    assert _process_state() == before and te_fake._RESOURCE[0] is None
    assert len(said) == 1 and "cp_resource" in said[0] and "NVTE" not in said[0]
    assert needs_entry_context(AttentionConfig(backend="xla", cross_backend="te"))
    assert not hasattr(AttentionConfig(), "te_shardy")


# ---------------------------------------------------------------- on a GPU (pytest -m gpu)


def test_gpu_hosts_keep_cpu_default_and_add_cuda():
    """conftest no longer forces JAX_PLATFORMS=cpu: with a GPU the tests get cpu,cuda (CPU
    stays the default, the gpu-marked tests find the GPU); a preset value is respected."""
    from conftest import jax_platforms

    assert jax_platforms(None, gpu=True) == "cpu,cuda"
    assert jax_platforms(None, gpu=False) == "cpu"
    assert jax_platforms("cuda", gpu=True) == "cuda"
    assert jax.default_backend() == "cpu" and len(jax.devices()) == 8


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cudnn", "te"])
def test_gpu_backends_match_reference_bf16(backend, rng, on_gpu):
    import contextlib

    from ditax.attention import platform
    from ditax.attention.te import configure_te

    ctx = contextlib.nullcontext()
    if backend == "te":
        if not platform.has_transformer_engine_jax():
            pytest.skip("transformer_engine.jax not installed")
        ctx = configure_te(None)
    with ctx:
        for B, Lq, Lk, N, K, masked in [(2, 256, 256, 4, 128, False), (2, 255, 77, 4, 64, True),
                                        (1, 999, 999, 2, 64, True)]:
            q, k, v, mask = make_inputs(rng, B, Lq, Lk, N, K, masked, dtype=jnp.bfloat16)
            f32 = [x.astype(jnp.float32) for x in (q, k, v)]
            out = jax.jit(lambda q, k, v, m: attend(q, k, v, backend=backend, kv_mask=m))(
                q, k, v, mask)
            assert rel_err(out, reference_attention(*f32, kv_mask=mask)) <= BF16_TOL
            ct = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
            g = jax.jit(jax.grad(lambda q: jnp.sum(
                attend(q, k, v, backend=backend, kv_mask=mask) * ct)))(q)
            g_ref = jax.grad(lambda q: jnp.sum(reference_attention(
                q.astype(jnp.float32), *f32[1:], kv_mask=mask) * ct))(q)
            assert rel_err(g, g_ref) <= 5e-2, (backend, Lq, rel_err(g, g_ref))
