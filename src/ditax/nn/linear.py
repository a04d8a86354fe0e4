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

    def from_heads(self, x):
        """The layer on ``x [..., N, K]`` flattened to ``[..., N·K]``, contracting ``(N, K)``
        directly: on TPU, where (8, 128) tiles cover the two minor dims, a reshape
        ``[L, N, K] → [L, N·K]`` is a relayout copy of the whole activation; splitting the
        kernel's input dim into ``(N, K)`` is free (it is the major dim)."""
        n, k = x.shape[-2:]
        w = self.kernel[...].astype(self.dtype).reshape(n, k, -1)
        y = jnp.einsum("...nk,nko->...o", x.astype(self.dtype), w)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y
