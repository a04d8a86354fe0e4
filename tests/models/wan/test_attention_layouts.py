"""Wan's attention in the head-major layout (the TPU kernels' ``[B, N, L, K]``: projections
write it, RMSNorm across heads and RoPE run in it, ``to_out`` reads the kernel's output)
against diffusers, forward and gradient (inputs and every parameter, in diffusers' keys), on
a context × tensor mesh, for head dims 64 and 128; which layout a plan picks, and that it is
part of the compiled program (a second call compiles nothing)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import ditax
from ditax.config import AttentionConfig
from ditax.io.convert import export
from ditax.models.wan.convert import config_weight_table
from ditax.parallel import make_mesh
from compiles import compiles
from wan_reference import make_diffusers_wan, rel_err

GRAD_INPUTS = ("hidden_states", "encoder_hidden_states")


@pytest.mark.parametrize("head_dim,acfg", [
    (64, AttentionConfig(backend="ulysses", local="flash", out_a2a="shard_major", block_q=8,
                         block_kv=8)),
    (128, AttentionConfig(backend="ulysses", local="flash", block_q=8, block_kv=8)),
], ids=["K64-ulysses-shard_major", "K128-ulysses-flat"])
def test_head_major_attention_matches_diffusers_forward_and_gradient(tmp_path, rng, head_dim,
                                                                     acfg):
    """mesh context=4 × tensor=2, 8 heads, 45 tokens (11.25 per shard: padded, partial
    kernel blocks); the loaded model's output and its gradient w.r.t. the latents, the text
    and every parameter against torch autograd."""
    m, folder = make_diffusers_wan(tmp_path, heads=8, head_dim=head_dim, layers=1)
    mesh = make_mesh({"context": 4, "tensor": 2})
    tr = ditax.load_transformer(folder, mesh=mesh, attention=acfg)
    plan = tr.module.attention_plan
    assert plan.self_attn.reads_head_major
    assert plan.cross_attn.reads_head_major              # flash cross-attention too
    lat = rng.standard_normal((1, 4, 3, 6, 10)).astype(np.float32)
    t = np.asarray([500.0], np.float32)
    text = rng.standard_normal((1, 7, 32)).astype(np.float32)
    m.zero_grad()
    leaves = {"hidden_states": torch.from_numpy(lat).requires_grad_(),
              "encoder_hidden_states": torch.from_numpy(text).requires_grad_()}
    ref = m(timestep=torch.from_numpy(t), return_dict=False, **leaves)[0]
    ct = rng.standard_normal(ref.shape).astype(np.float32)
    (ref * torch.from_numpy(ct)).sum().backward()

    @jax.jit
    def out_and_grads(tr, lat, text):
        out, pull = jax.vjp(lambda tr, lat, text: tr(lat, t, text), tr, lat, text)
        return out, pull(jnp.asarray(ct))

    out, grads = out_and_grads(tr, jnp.asarray(lat), jnp.asarray(text))
    assert rel_err(out, ref.detach().numpy()) <= 1e-5, rel_err(out, ref.detach().numpy())
    for name, g in zip(GRAD_INPUTS, grads[1:]):
        assert rel_err(g, leaves[name].grad.numpy()) <= 1e-5, name
    ours = export(config_weight_table(tr.config), grads[0]._state)
    theirs = {k: p.grad.numpy() for k, p in m.named_parameters() if p.grad is not None}
    errs = {k: rel_err(ours[k], theirs[k]) for k in theirs}
    assert max(errs.values()) <= 1e-5, {k: e for k, e in errs.items() if e > 1e-5}


def test_layout_follows_the_plan_and_is_compiled_in(tmp_path, rng):
    """Token-major for xla (and any kernel that reads ``[B, L, N, K]``), head-major for
    splash / flash and the sequence backends around them; the choice is static (the plan is
    part of the module's graph), so each model compiles its forward once and the values
    agree."""
    m, folder = make_diffusers_wan(tmp_path, heads=2, head_dim=64, layers=1)
    lat = rng.standard_normal((1, 4, 1, 4, 6)).astype(np.float32)
    t = np.asarray([300.0], np.float32)
    text = rng.standard_normal((1, 5, 32)).astype(np.float32)
    outs = {}
    with compiles() as log:
        for backend in ("xla", "splash"):
            tr = ditax.load_transformer(folder, attention=backend)
            assert tr.module.attention_plan.self_attn.reads_head_major == (backend == "splash")
            outs[backend] = np.asarray(tr(lat, t, text))
            before = len(log.names)
            np.testing.assert_array_equal(np.asarray(tr(lat, t, text)), outs[backend])
            assert len(log.names) == before, log.names[before:]     # nothing recompiled
    assert rel_err(outs["splash"], outs["xla"]) <= 1e-5
