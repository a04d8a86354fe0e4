"""Dense layer with the storage / compute dtype split every model here uses."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class Linear(nnx.Module):
    """``y = x @ kernel + bias``; kernel ``[in, out]`` (torch ``weight.T``), compute in ``dtype``.

    ``param_dtype`` is the storage dtype of ``kernel`` / ``bias`` (LeCun-normal / zero init);
    both are cast to ``dtype`` for the matmul.
    """

    def __init__(self, din: int, dout: int, *, dtype, param_dtype, rngs: nnx.Rngs, bias=True):
        pd = jnp.dtype(param_dtype)
        self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (din, dout), pd))
        self.bias = nnx.Param(jnp.zeros((dout,), pd)) if bias else None
        self.dtype = jnp.dtype(dtype)

    def __call__(self, x):
        y = jnp.einsum("...i,io->...o", x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y
