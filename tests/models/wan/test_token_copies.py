"""Wan's tokens padded once per forward with copies of the first ones
(:meth:`WanTransformer.token_copies`, splash's ``copied_keys``): the prediction, its
gradient and the block-causal forward equal the model's without copies (diffusers' for the
prediction); the copies appear only where the kernel would have copied its keys anyway."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ditax
from ditax.config import AttentionConfig
from ditax.models.wan.causal import causal_forward
from wan_reference import make_diffusers_wan, rel_err, run_diffusers

# 10 x 20 x 20 latents, patch (1, 2, 2): 1,000 tokens; splash blocks of 128 → 1,024, 24 copies
COPIES = AttentionConfig(backend="splash", block_q=128, block_kv=128, padded_keys="duplicate")
MASKED = AttentionConfig(backend="splash", block_q=128, block_kv=128, padded_keys="mask")


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    m, folder = make_diffusers_wan(tmp_path_factory.mktemp("copies"), heads=2, head_dim=16,
                                   layers=2)
    rng = np.random.default_rng(0)
    lat = rng.standard_normal((1, 4, 10, 20, 20)).astype(np.float32)
    t = np.array([500.0], np.float32)
    text = rng.standard_normal((1, 7, 32)).astype(np.float32)
    return m, folder, (lat, t, text)


def test_copies_keep_the_prediction_and_only_where_the_kernel_copies(wan):
    m, folder, (lat, t, text) = wan
    model = ditax.load_transformer(folder, attention=COPIES)
    h, ctx = model.module.embed(jnp.asarray(lat), jnp.asarray(t), jnp.asarray(text))
    assert (ctx.seq, ctx.copies, ctx.pad, h.shape[1]) == (1000, 24, 24, 1024)
    np.testing.assert_array_equal(np.asarray(h[:, 1000:]), np.asarray(h[:, :24]))
    out = np.asarray(model(lat, t, text))
    assert rel_err(out, run_diffusers(m, lat, t, text)) <= 1e-5
    masked = ditax.load_transformer(folder, attention=MASKED)
    args = (jnp.asarray(lat), jnp.asarray(t), jnp.asarray(text))
    assert masked.module.embed(*args)[1].copies == 0           # "mask" asks for no copies
    assert rel_err(out, np.asarray(masked(lat, t, text))) <= 1e-5


def test_copies_keep_the_gradient(wan):
    """Training through the copies: the gradient (of the latents, through every layer's
    attention VJP) equals the masked kernel's without copies."""
    _, folder, (lat, t, text) = wan
    w = jax.random.normal(jax.random.key(1), lat.shape)

    def grad(acfg):
        model = ditax.load_transformer(folder, attention=acfg)
        return np.asarray(jax.grad(lambda x: jnp.sum(model(x, t, text) * w))(jnp.asarray(lat)))

    got, want = grad(COPIES), grad(MASKED)
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)


def test_block_causal_forward_with_copies_equals_its_reference(wan):
    """A block-causal forward of a model that appended copies: the chunk calls mask the
    copies with their key masks; the dense oracle's mask leaves them out too."""
    _, folder, (lat, t, text) = wan
    model = ditax.load_transformer(folder, attention=COPIES).module
    got = causal_forward(model, lat, t, text, chunk=4, context_chunks=1)
    ref = causal_forward(model, lat, t, text, chunk=4, context_chunks=1, reference=True)
    assert rel_err(np.asarray(got), np.asarray(ref)) <= 1e-5
    plain = causal_forward(ditax.load_transformer(folder, attention=MASKED).module, lat, t, text,
                           chunk=4, context_chunks=1)
    assert rel_err(np.asarray(got), np.asarray(plain)) <= 1e-5
