"""Block-causal Wan on 8 fake devices (issue 59 item 1): the whole-video block-causal forward
and the chunk-by-chunk KV-cache forward on a mesh (batch over fsdp, tokens over context — the
ring / Ulysses over the cache's keys) equal the single-device dense masked reference; the
cache is sharded like the activations."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from ditax.config import AttentionConfig, ModelConfig
from ditax.models.wan.build import init_model
from ditax.models.wan.causal import causal_forward
from ditax.models.wan.kv_cache import forward_chunk, init_cache
from ditax.parallel import make_mesh

CFG = ModelConfig(num_attention_heads=4, attention_head_dim=16, ffn_dim=48, num_layers=2,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)


@pytest.mark.parametrize("mesh_kw, backend", [
    (dict(context=8), "xla"),                  # 60 tokens a chunk: padded to 64
    (dict(fsdp=2, context=4), "ring"),
])
def test_mesh_equals_the_single_device_reference(rng, mesh_kw, backend):
    b = 4
    lat = rng.standard_normal((b, 4, 4, 6, 10)).astype(np.float32)
    t = rng.uniform(0, 1000, (b,)).astype(np.float32)
    text = rng.standard_normal((b, 7, 24)).astype(np.float32)
    want = np.asarray(causal_forward(init_model(CFG, seed=1), lat, t, text, chunk=2,
                                     reference=True))
    model = init_model(CFG, AttentionConfig(backend=backend), mesh=make_mesh(mesh_kw), seed=1)
    gdef, state = nnx.split(model)
    whole = jax.jit(lambda s: causal_forward(nnx.merge(gdef, s), lat, t, text, chunk=2))
    np.testing.assert_allclose(np.asarray(whole(state)), want, rtol=1e-5, atol=1e-5)

    step = jax.jit(lambda s, x, c: forward_chunk(nnx.merge(gdef, s), x, t, text, c))
    cache = init_cache(model, b, (2, 6, 10), 1)
    assert cache.k.sharding.spec == cache.v.sharding.spec
    assert "context" in cache.k.sharding.spec, cache.k.sharding.spec
    for i in range(2):
        out, cache = step(state, lat[:, :, 2 * i:2 * i + 2], cache)
        np.testing.assert_allclose(np.asarray(out), want[:, :, 2 * i:2 * i + 2], rtol=1e-5,
                                   atol=1e-5, err_msg=f"chunk {i}")
    spec = cache.k.sharding.spec
    assert "context" in spec and (mesh_kw.get("fsdp", 1) == 1 or "fsdp" in spec), spec


def test_chunk_sampler_on_a_mesh_equals_one_device(rng):
    """Causal sampling with CFG (cond / uncond rows over fsdp, each with its cache) and
    Ulysses over the cache's keys: the single device's latents."""
    import jax.numpy as jnp

    from ditax.models.wan import kv_cache
    from ditax.pipelines.causal import CausalSampler
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler

    sched = FlowMatchEulerScheduler(shift=3.0)
    text = jnp.asarray(rng.standard_normal((2, 5, 24)), jnp.float32)
    kw = dict(num_frames=6, latent_hw=(6, 10), num_inference_steps=2, sigmas=(1.0, 0.5),
              guidance_scale=3.0, seed=1)
    one = CausalSampler(init_model(CFG, seed=1), kv_cache, sched, chunk=2, context_chunks=1)
    model = init_model(CFG, AttentionConfig(backend="ulysses"),
                       mesh=make_mesh(dict(fsdp=2, context=4)), seed=1)
    many = CausalSampler(model, kv_cache, sched, chunk=2, context_chunks=1)
    np.testing.assert_allclose(np.asarray(many.sample(text, **kw)),
                               np.asarray(one.sample(text, **kw)), rtol=1e-5, atol=1e-5)
