"""Causal chunk-by-chunk sampling (issue 59 item 3) on a tiny random Wan: one chunk covering
the video is the bidirectional sampler's loop; several chunks equal the uncached
recomputation (the whole prefix re-run with the block-causal mask every step, the clean
chunks at t = 0); a long run keeps one cache shape and one compiled chunk program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.config import ConfigError, ModelConfig
from ditax.errors import RequestError
from ditax.models.wan import kv_cache
from ditax.models.wan.build import init_model
from ditax.models.wan.causal import causal_forward
from ditax.pipelines.causal import CausalSampler, compiled_chunk_programs
from ditax.pipelines.denoise import _denoise_step
from ditax.pipelines.sampling import initial_noise, set_timesteps
from ditax.pipelines.wan.inputs import wan_inputs
from ditax.schedulers import from_config
from ditax.schedulers.flow_match import FlowMatchEulerScheduler

CFG = ModelConfig(num_attention_heads=2, attention_head_dim=16, ffn_dim=48, num_layers=2,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)
SCHED = FlowMatchEulerScheduler(shift=3.0)
SIGMAS = (1.0, 0.75, 0.5, 0.25)


@pytest.fixture(scope="module")
def model():
    return init_model(CFG, seed=7)


def _text(rng, rows):
    return jnp.asarray(rng.standard_normal((rows, 5, 24)), jnp.float32)


UNIPC = from_config(dict(_class_name="UniPCMultistepScheduler", prediction_type="flow_prediction",
                         use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=3.0))


@pytest.mark.parametrize("guidance, sched, sigmas", [
    (1.0, SCHED, SIGMAS), (4.0, SCHED, SIGMAS), (1.0, UNIPC, None)])
def test_one_chunk_is_the_bidirectional_sampler(model, rng, guidance, sched, sigmas):
    use_cfg = guidance > 1
    text = _text(rng, 2 if use_cfg else 1)
    f, hw = 3, (4, 6)
    sampler = CausalSampler(model, kv_cache, sched, chunk=f)
    got = np.asarray(sampler.sample(text, num_frames=f, latent_hw=hw, num_inference_steps=4,
                                    sigmas=sigmas, guidance_scale=guidance, seed=11))
    shape = (1, 4, f) + hw
    x, state = initial_noise(11, shape), set_timesteps(sched, 4, shape, sigmas)
    gdef, params = nnx.split(model)
    for _ in range(4):
        x, state = _denoise_step(gdef, wan_inputs, sched, "batched", use_cfg, params, state, x,
                                 text, jnp.float32(guidance), None)
    np.testing.assert_allclose(got, np.asarray(x), rtol=1e-5, atol=1e-5)
    assert sampler.last_stats["chunks"] == 1 and sampler.last_stats["transformer_calls"] == 5


@pytest.mark.parametrize("context_chunks", [None, 1])
def test_cached_chunks_equal_the_uncached_recomputation(model, rng, context_chunks):
    """Each step of chunk i re-runs the whole prefix [clean chunks at t=0, the noisy chunk at
    t] with the (sink + window) block-causal mask and no cache."""
    k, n, hw = 1, 4, (2, 4)
    text = _text(rng, 1)
    sampler = CausalSampler(model, kv_cache, SCHED, chunk=k, context_chunks=context_chunks)
    got = np.asarray(sampler.sample(text, num_frames=k * n, latent_hw=hw,
                                    num_inference_steps=3, sigmas=SIGMAS[:3], seed=2))
    noise = initial_noise(2, (1, 4, k * n) + hw)
    gdef, params = nnx.split(model)
    whole = jax.jit(lambda p, lat, t: causal_forward(nnx.merge(gdef, p), lat, t, text, chunk=k,
                                                     context_chunks=context_chunks,
                                                     reference=True))
    clean = noise[:, :, :0]
    tokens = k * hw[0] * hw[1] // 4
    for i in range(n):
        x, state = noise[:, :, i * k:(i + 1) * k], set_timesteps(SCHED, 3, (k,), SIGMAS[:3])
        for s in range(3):
            t = state.timesteps[s]
            per_token = jnp.concatenate([jnp.zeros((1, i * tokens)),
                                         jnp.full((1, tokens), t)], axis=1)
            out = whole(params, jnp.concatenate([clean, x], axis=2), per_token)
            x, state = SCHED.step(state, out[:, :, -k:], x)
        clean = jnp.concatenate([clean, x], axis=2)
    np.testing.assert_allclose(got, np.asarray(clean), rtol=1e-5, atol=1e-5)


def test_long_stream_keeps_one_cache_and_one_program(model, rng):
    """Twelve chunks through a sink + 2 window: yielded one by one, the cache's shapes never
    change, and the chunk program compiles once (a new shape: exactly one more)."""
    text = _text(rng, 1)
    sampler = CausalSampler(model, kv_cache, SCHED, chunk=2, context_chunks=2)
    before = compiled_chunk_programs()
    stream = sampler.stream(text, num_frames=24, latent_hw=(2, 6), num_inference_steps=2,
                            sigmas=SIGMAS[:2], seed=5)
    first = next(stream)
    assert first.shape == (1, 4, 2, 2, 6) and sampler.last_stats["chunks"] == 1
    rest = list(stream)
    st = sampler.last_stats
    assert len(rest) == 11 and st["chunks"] == 12 and st["transformer_calls"] == 12 * 3
    assert len(st["cache_shapes"]) == 1
    assert st["cache_shape"] == (2, 1, (3 + 1) * 2 * 3, 2, 16)    # 3 slots + work, 6 tokens
    assert compiled_chunk_programs() == before + 1
    assert all(np.isfinite(np.asarray(c)).all() for c in rest)


def test_bad_requests_give_one_clear_line(model, rng):
    text = _text(rng, 1)
    sampler = CausalSampler(model, kv_cache, SCHED, chunk=3)
    kw = dict(latent_hw=(2, 4), num_inference_steps=2, sigmas=SIGMAS[:2])
    with pytest.raises(ConfigError, match=r"latent frames=7 .* model.causal_chunk=3"):
        next(sampler.stream(text, num_frames=7, **kw))
    with pytest.raises(RequestError, match=r"at most 341"):
        next(sampler.stream(text, num_frames=3 * 342, **kw))
    with pytest.raises(ConfigError, match=r"sample.context_chunks=0"):
        next(CausalSampler(model, kv_cache, SCHED, chunk=3, context_chunks=0).stream(
            text, num_frames=6, **kw))
