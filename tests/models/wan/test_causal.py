"""Block-causal Wan (issue 59 item 1): the whole-video block-causal forward (the model's kernel
per query chunk) equals the dense element-masked reference; the chunk-by-chunk KV-cache
forward equals it chunk for chunk, with and without a sink + rolling window; one chunk
covering the video is today's bidirectional forward; bad values give one clear line."""

from __future__ import annotations

import dataclasses

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.config import AttentionConfig, ConfigError, ModelConfig
from ditax.errors import RequestError
from ditax.models.wan.build import init_model
from ditax.models.wan.causal import block_causal_mask, causal_forward, token_chunks
from ditax.models.wan.embeddings import rope_cos_sin
from ditax.models.wan.kv_cache import chunk_rope, forward_chunk, init_cache

CFG = ModelConfig(num_attention_heads=2, attention_head_dim=16, ffn_dim=48, num_layers=2,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)
TOL = dict(rtol=1e-5, atol=1e-5)


def _inputs(rng, f, y=4, x=6, b=2):
    lat = rng.standard_normal((b, 4, f, y, x)).astype(np.float32)
    t = rng.uniform(0, 1000, size=(b,)).astype(np.float32)
    text = rng.standard_normal((b, 7, 24)).astype(np.float32)
    return lat, t, text


@pytest.fixture(scope="module")
def model():
    return init_model(CFG, seed=3)


def _chunked(model, lat, t, text, chunk, context_chunks):
    """Chunk by chunk through the (jitted) KV-cache forward: the outputs along F, the cache."""
    gdef, state = nnx.split(model)
    step = jax.jit(lambda s, x, c: forward_chunk(nnx.merge(gdef, s), x, t, text, c))
    cache = init_cache(model, lat.shape[0], (chunk,) + lat.shape[3:], context_chunks)
    outs = []
    for i in range(lat.shape[2] // chunk):
        out, cache = step(state, lat[:, :, i * chunk:(i + 1) * chunk], cache)
        outs.append(np.asarray(out))
    return np.concatenate(outs, axis=2), cache, step


def test_mask_and_token_chunks():
    ids = token_chunks((5, 1, 2), 2, length=11)
    np.testing.assert_array_equal(ids, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    m = block_causal_mask(np.arange(5), context_chunks=1)
    # row 3 sees the sink 0, its one previous chunk 2 and itself
    np.testing.assert_array_equal(m[3], [True, False, True, True, False])
    assert block_causal_mask(np.arange(3))[2].all() and not block_causal_mask(np.arange(3))[0, 1]


def test_kernel_path_equals_dense_masked_reference(model, rng):
    lat, t, text = _inputs(rng, f=5)                      # chunks 2, 2, 1 (last one short)
    got = np.asarray(causal_forward(model, lat, t, text, chunk=2))
    want = np.asarray(causal_forward(model, lat, t, text, chunk=2, reference=True))
    np.testing.assert_allclose(got, want, **TOL)
    # it is causal: the first chunk's output ignores the later frames
    lat2 = lat.copy()
    lat2[:, :, 2:] = rng.standard_normal(lat2[:, :, 2:].shape)
    again = np.asarray(causal_forward(model, lat2, t, text, chunk=2))
    np.testing.assert_allclose(again[:, :, :2], got[:, :, :2], **TOL)
    assert np.abs(again[:, :, 2:] - got[:, :, 2:]).max() > 1e-3
    # and differs from the bidirectional forward where a chunk sees a later one
    full = np.asarray(model(lat, t, text))
    assert np.abs(full[:, :, :2] - got[:, :, :2]).max() > 1e-3


def test_chunk_covering_the_video_is_the_bidirectional_forward(model, rng):
    lat, t, text = _inputs(rng, f=3)
    full = np.asarray(model(lat, t, text))
    for chunk in (3, 4):
        np.testing.assert_allclose(np.asarray(causal_forward(model, lat, t, text, chunk=chunk)),
                                   full, **TOL)
    # one chunk through the cache (empty: its slots all masked) too
    out, cache, _ = _chunked(model, lat, t, text, chunk=3, context_chunks=1)
    np.testing.assert_allclose(out, full, **TOL)
    assert int(cache.index) == 1


@pytest.mark.parametrize("layout", ["xla", "head_major", "unscanned_remat", "int8_wa"])
def test_kv_cache_forward_equals_the_causal_forward(rng, layout):
    """Every chunk of the cached run equals that chunk of the whole-video block-causal
    forward (cache large enough: nothing evicted); one compiled chunk program. Also with the
    blocks unrolled under remat (the cache rides in the carry either way), and with 8-bit
    block linears x 8-bit activations (``model.quantize=int8 model.quantize_activations=
    true``: per-token scales, so a chunk's tokens quantize as in the whole video)."""
    acfg = (AttentionConfig(backend="splash") if layout == "head_major"
            else AttentionConfig(backend="xla"))
    cfg = {"unscanned_remat": dataclasses.replace(CFG, scan_layers=False, remat="full"),
           "int8_wa": dataclasses.replace(CFG, quantize="int8", quantize_activations=True),
           }.get(layout, CFG)
    model = init_model(cfg, acfg, seed=4)
    assert (model.blocks.attn1.to_k.quant is not None) == (layout == "int8_wa")
    assert model.attention_plan.self_attn.reads_head_major == (layout == "head_major")
    lat, t, text = _inputs(rng, f=6)
    want = np.asarray(causal_forward(model, lat, t, text, chunk=2, reference=True))
    got, cache, step = _chunked(model, lat, t, text, chunk=2, context_chunks=2)
    for i in range(3):
        np.testing.assert_allclose(got[:, :, 2 * i:2 * i + 2], want[:, :, 2 * i:2 * i + 2],
                                   **TOL, err_msg=f"chunk {i}")
    assert int(cache.index) == 3
    assert step._cache_size() == 1


def test_rolling_window_equals_the_sink_window_mask(model, rng):
    """Seven chunks through a cache of the sink + 2 chunks (the ring wraps twice): each equals
    the reference under the sink + window mask, and not the unwindowed one."""
    lat, t, text = _inputs(rng, f=7, y=2, x=4)
    want = np.asarray(causal_forward(model, lat, t, text, chunk=1, context_chunks=2,
                                     reference=True))
    full = np.asarray(causal_forward(model, lat, t, text, chunk=1, reference=True))
    got, cache, step = _chunked(model, lat, t, text, chunk=1, context_chunks=2)
    np.testing.assert_allclose(got, want, **TOL)
    assert np.abs(got[:, :, 4:] - full[:, :, 4:]).max() > 1e-4
    np.testing.assert_allclose(got[:, :, :3], full[:, :, :3], **TOL)
    assert cache.k.shape == (2, 2, (3 + 1) * 2, 2, 16) and int(cache.index) == 7  # + the work slot
    assert step._cache_size() == 1
    # the windowed kernel path equals the windowed reference too
    np.testing.assert_allclose(np.asarray(causal_forward(model, lat, t, text, chunk=1,
                                                         context_chunks=2)), want, **TOL)


def test_rope_continues_past_the_grid():
    """A chunk's tables are the rows of the whole video's at its frame positions, for a
    traced offset too, beyond any training length."""
    grid = (40, 3, 2)
    cos, sin = rope_cos_sin(16, grid)
    for f0 in (0, 7, 37):
        c, s = jax.jit(lambda f: chunk_rope(CFG, (3, 3, 2), f))(jnp.int32(f0))
        rows = slice(f0 * 6, (f0 + 3) * 6)
        np.testing.assert_array_equal(np.asarray(c), np.asarray(cos)[rows])
        np.testing.assert_array_equal(np.asarray(s), np.asarray(sin)[rows])


@pytest.mark.parametrize("call, match", [
    (lambda m, a: causal_forward(m, *a, chunk=0), r"model.causal_chunk=0 must be a positive"),
    (lambda m, a: causal_forward(m, *a, chunk=2, context_chunks=0),
     r"sample.context_chunks=0 must be >= 1"),
    (lambda m, a: init_cache(m, 2, (2, 4, 6), 0), r"sample.context_chunks=0"),
    (lambda m, a: init_cache(m, 2, (-1, 4, 6), 1), r"model.causal_chunk=-1"),
])
def test_bad_values_give_one_clear_line(model, rng, call, match):
    args = _inputs(rng, f=3)
    with pytest.raises(ConfigError, match=match) as e:
        call(model, args)
    assert "\n" not in str(e.value)


def test_chunks_must_divide_where_the_cache_needs_it(model, rng):
    from ditax.models.wan.causal import check_causal

    with pytest.raises(ConfigError, match=r"latent frames=7 .* model.causal_chunk=3; use 6 or 9"):
        check_causal(3, None, 1, frames=7)
    with pytest.raises(ConfigError, match=r"not a multiple of the temporal patch size 2"):
        check_causal(3, None, 2)
    cache = init_cache(model, 2, (2, 4, 6), 1)    # (2 slots + the work slot) x 12 tokens
    lat, t, text = _inputs(rng, f=5)
    with pytest.raises(RequestError, match=r"does not fit chunks of 30 tokens"):
        forward_chunk(model, lat, t, text, cache)


def test_gradients_kernel_path_and_cache_path(model, rng):
    """The kernel path's weight gradients equal the dense reference's; the gradient of the
    last chunk's output w.r.t. its own latents is the same through the cache as through the
    whole-video forward (the cache holds the earlier chunks only)."""
    lat, t, text = _inputs(rng, f=4, b=1)
    gdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def grads(p):
        def loss(p, reference):
            out = causal_forward(nnx.merge(gdef, p, rest), lat, t, text, chunk=2,
                                 reference=reference)
            return jnp.sum(out ** 2)
        return jax.grad(loss)(p, False), jax.grad(loss)(p, True)

    for a, b in zip(*(jax.tree.leaves(g) for g in grads(params))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)

    # differentiated w.r.t. the weights too: NNX's scan refuses weights of an outer trace
    def whole(last, p):
        full = jnp.concatenate([lat[:, :, :2], last], axis=2)
        out = causal_forward(nnx.merge(gdef, p, rest), full, t, text, chunk=2)
        return jnp.sum(out[:, :, 2:] ** 2)

    def cached(last, p, cache):
        out, _ = forward_chunk(nnx.merge(gdef, p, rest), last, t, text, cache, write=False)
        return jnp.sum(out ** 2)

    @jax.jit
    def latent_grads(p, last, cache):
        return (jax.grad(cached, (0, 1))(last, p, cache)[0],
                jax.grad(whole, (0, 1))(last, p)[0])

    cache = init_cache(model, 1, (2, 4, 6), 1)
    _, cache = forward_chunk(model, lat[:, :, :2], t, text, cache)
    got, want = latent_grads(params, lat[:, :, 2:], cache)
    assert np.abs(np.asarray(want)).max() > 1e-3
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_cache_is_attended_in_place_not_concatenated(model, rng):
    """Each layer writes the chunk's keys / values into its work region of the cache (a
    dynamic_update_slice) and attends to the layer as it lies: no per-layer concatenate of
    cache and chunk (docs/causal_streaming.md: two copies a layer-forward on a v5e before)."""
    lat, t, text = _inputs(rng, f=2)
    cache = init_cache(model, 2, (2, 4, 6), 2)
    gdef, state = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda s, c: forward_chunk(nnx.merge(gdef, s), lat, t, text, c,
                                                      write=False))(state, cache)

    def eqns(jx):
        for e in jx.eqns:
            yield e
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                yield from eqns(sub)

    found = [e for e in eqns(jaxpr.jaxpr) if any(v.aval.ndim == 4 for v in e.outvars)]
    # along the tokens (RoPE's halves join along the head dim, 3)
    assert not [e for e in found if e.primitive.name == "concatenate"
                and e.params["dimension"] != 3]
    assert any(e.primitive.name == "dynamic_update_slice" for e in found)
