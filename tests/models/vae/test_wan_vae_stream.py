"""Streaming Wan VAE decode (issue 59): latent pieces decoded as a causal sampler makes them,
the feature cache carried, give the frames of the whole decode — whatever the split."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.models.vae.wan import WanVAE, WanVAEConfig
from ditax.models.vae.wan.stream import StreamDecoder
from shared_inputs import randomise

SMALL = dict(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
             temperal_downsample=(False, True, True))


@pytest.fixture(scope="module")
def vae():
    return randomise(WanVAE(WanVAEConfig(**SMALL), rngs=nnx.Rngs(0)), 1)


@pytest.mark.parametrize("pieces", [(2, 2, 2), (1, 5), (3, 3)])
def test_streamed_pieces_equal_the_whole_decode(vae, pieces):
    z = jax.random.normal(jax.random.key(3), (1, 4, sum(pieces), 2, 3), jnp.float32)
    whole = np.asarray(vae.decode(z, path="plain"))
    dec, outs, at = StreamDecoder(vae, path="plain"), [], 0
    for i, n in enumerate(pieces):
        out = np.asarray(dec(z[:, :, at:at + n]))
        assert out.shape[2] == (1 + 4 * (n - 1) if i == 0 else 4 * n)
        outs.append(out)
        at += n
    np.testing.assert_allclose(np.concatenate(outs, axis=2), whole, rtol=0, atol=1e-5)
    assert dec.frames == sum(pieces)


def test_bad_latents_say_the_shape(vae):
    with pytest.raises(ValueError, match=r"expected latents \[B, 4, F, Y, X\]"):
        StreamDecoder(vae)(jnp.zeros((1, 3, 2, 2, 2)))
