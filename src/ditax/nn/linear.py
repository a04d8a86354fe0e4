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

    def to_head_major(self, x, num_heads: int):
        """The layer on ``x [B, L, in]`` written head-major ``[B, N, L, K]`` (out = N·K)
        straight from the dot (the TPU attention kernels' layout; no relayout after it)."""
        w = self.kernel[...].astype(self.dtype).reshape(x.shape[-1], num_heads, -1)
        y = jnp.einsum("bli,ink->bnlk", x.astype(self.dtype), w)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype).reshape(num_heads, 1, -1)
        return y

    def from_head_major(self, x):
        """The layer on head-major ``x [B, N, L, K]`` (in = N·K) → ``[B, L, out]``,
        contracting ``(N, K)`` where the attention kernel wrote them."""
        n, k = x.shape[1], x.shape[3]
        w = self.kernel[...].astype(self.dtype).reshape(n, k, -1)
        y = jnp.einsum("bnlk,nko->blo", x.astype(self.dtype), w)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y
