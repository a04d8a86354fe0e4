"""Flux VAE gradients: the training forward (``FluxVAE.autoencode``: encode → posterior draw →
decode) of a tiny random diffusers AutoencoderKL saved and reloaded, and the gradient of a
reconstruction loss w.r.t. every parameter, equal to torch's within 1e-5."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from flax import nnx  # noqa: E402

from ditax.io import convert  # noqa: E402
from ditax.models.vae.kl.convert import weight_table  # noqa: E402
from flux_vae_reference import rel as _rel, saved_pair  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    return (*saved_pair("flux", tmp_path_factory.mktemp("flux_vae_grad")), None)


def test_autoencode_gradients_match_torch(flux, rng):
    """The training forward (encode → posterior draw with a given noise → decode, ``autoencode``)
    and d/dparams of sum(reconstruction * w) equal torch's for every tensor of the model.
    The mid blocks' ``to_k.bias`` gets no gradient analytically (adding a constant to every
    key's logit of a query row leaves its softmax unchanged): both sides are rounding noise
    there, checked against the model's largest gradient instead."""
    ref, vae, _ = flux
    x = rng.uniform(-1, 1, (1, 3, 16, 24)).astype(np.float32)
    w = rng.standard_normal((1, 3, 16, 24)).astype(np.float32)
    key = jax.random.key(7)
    eps = np.array(jax.random.normal(key, (1, 8, 12, 16), jnp.float32))     # NHWC, as autoencode

    ref.zero_grad()
    post = ref.encode(torch.from_numpy(x)).latent_dist
    zs = post.mean + post.std * torch.from_numpy(eps.transpose(0, 3, 1, 2))
    recon = ref.decode(zs).sample
    loss = (recon * torch.from_numpy(w)).sum()
    loss.backward()
    expect = {k: p.grad.numpy() for k, p in ref.named_parameters()}

    graphdef, params = nnx.split(vae)
    nhwc = lambda a: jnp.transpose(jnp.asarray(a), (0, 2, 3, 1))  # noqa: E731

    @jax.jit
    def ours(params):
        out, mean, logvar = nnx.merge(graphdef, params).autoencode(nhwc(x), key)
        return jnp.sum(out * nhwc(w)), (out, mean)

    (value, (out, mean)), grads = jax.value_and_grad(ours, has_aux=True)(params)
    assert _rel(out, nhwc(recon.detach().numpy())) < TOL
    assert _rel(mean, nhwc(post.mean.detach().numpy())) < TOL
    assert abs(float(value) - loss.item()) <= TOL * abs(loss.item())
    got = convert.export(weight_table(vae), grads)
    assert set(got) == set(expect) and len(expect) > 60
    scale = max(np.abs(g).max() for g in expect.values())
    zero = [k for k in expect if k.endswith("attentions.0.to_k.bias")]
    assert len(zero) == 2
    for k in zero:
        assert max(np.abs(got[k]).max(), np.abs(expect[k]).max()) < 1e-5 * scale
    worst = max((_rel(got[k], expect[k]), k) for k in expect if k not in zero)
    assert worst[0] < TOL, worst
