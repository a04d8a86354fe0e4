"""Small building blocks shared by the flash kernels, written the way Mosaic (TPU) lowers them.

- :func:`mxu_dot`: an MXU product in the operands' dtype with float32 accumulation and the
  precision pinned, so a kernel compiles the same whatever ``jax_default_matmul_precision``
  says: under "highest" Mosaic refuses bf16 operands ("Mosaic failed to compile TPU kernel:
  Bad lhs type", libtpu 0.0.42.1 / v6e). bf16 × bf16 products are exact in float32, so
  ``DEFAULT`` (one MXU pass) loses nothing there; float32 operands keep full float32 accuracy
  (``HIGHEST``), as their dtype asks.
- :func:`as_column`: per-row vectors (log-sum-exp, softmax delta, the
  key mask) travel as lane rows ``[..., n, 1, block]``. That is a free reshape of
  ``[..., n * block]``; its block's two minor dims ``(1, block)`` equal the array's, and Pallas
  TPU takes a block's last two dims only when they are multiples of (8, 128) or the whole
  axes, so it lowers for every block that is a multiple of 8; and it is compact in HBM, where
  a ``[..., L, 1]`` float32 column is tiled (8, 128), i.e. padded 128×. Kernels turn a row
  into the ``[block, 1]`` column they broadcast with :func:`as_column`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NT = (((1,), (1,)), ((), ()))   # A Bᵀ: contract both minor dims
NN = (((1,), (0,)), ((), ()))   # A B


def mxu_dot(a, b, dims):
    """``dot_general(a, b, dims)`` with float32 accumulation and a pinned precision.

    Operands of two dtypes (a ring's float32 carried output and its cotangent against bf16
    k / v) are both promoted first: Mosaic takes one operand dtype ("Bad rhs type", libtpu
    0.0.42.1 / v6e); the promotion is exact, so interpreted results do not change."""
    if a.dtype != b.dtype:
        dtype = jnp.promote_types(a.dtype, b.dtype)
        a, b = a.astype(dtype), b.astype(dtype)
    prec = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else jax.lax.Precision.DEFAULT
    return jax.lax.dot_general(a, b, dims, precision=prec, preferred_element_type=jnp.float32)


def as_column(row_ref):
    """A ``[1, b]`` lane-row block (ref) as a ``[b, 1]`` column value."""
    return jnp.expand_dims(row_ref[0], -1)
