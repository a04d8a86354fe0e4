"""The head-major views of a layer (what Wan's attention uses for the TPU kernels,
``[B, N, L, K]``): ``Linear.to_head_major`` / ``from_head_major`` and their unmerged-LoRA
versions (base and low-rank terms) equal the plain call viewed head-major."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.lora.unmerged import LoraLinear
from ditax.nn import Linear


def _heads(y, n):
    """``[B, L, N·K]`` → ``[B, N, L, K]``."""
    return jnp.swapaxes(y.reshape(y.shape[:-1] + (n, -1)), 1, 2)


@pytest.mark.parametrize("out_heads", [None, 4], ids=["kernel-in-out", "kernel-head-major"])
def test_head_major_views_of_linear_and_unmerged_lora(rng, out_heads):
    """Also for a kernel stored head-major ``[N, in, K]`` (``out_heads``): the same values
    as the ``[in, out]`` kernel it was drawn as."""
    B, L, D, N, R = 2, 5, 16, 4, 3
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    base = Linear(D, D, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0),
                  out_heads=out_heads)
    plain = Linear(D, D, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(base.matrix(), plain.kernel[...])
    assert base.dims() == ((), D, D)
    base.bias[...] = f(D)
    lora = LoraLinear(base, f(R, D), f(R, D), jnp.full((R,), 0.5), (0, 0, 1), f(2, D),
                      jnp.asarray([0.7, -1.2]))
    x, o = f(B, L, D), f(B, N, L, D // N)
    for layer in (base, lora):
        np.testing.assert_allclose(layer.to_head_major(x, N), _heads(layer(x), N),
                                   rtol=1e-5, atol=1e-5)
        flat = jnp.swapaxes(o, 1, 2).reshape(B, L, D)
        np.testing.assert_allclose(layer.from_head_major(o), layer(flat), rtol=1e-5, atol=1e-5)
    assert not np.allclose(lora(x), base(x))        # the LoRA terms are there
