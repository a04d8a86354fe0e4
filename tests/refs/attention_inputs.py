"""Random attention inputs and the tolerances the attention tests share."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

F32_TOL, GRAD_TOL, BF16_TOL = 2e-5, 5e-5, 2e-2


def make_inputs(rng, B, Lq, Lk, N, K, masked, dtype=jnp.float32):
    q = jnp.asarray(rng.standard_normal((B, Lq, N, K)), dtype)
    k = jnp.asarray(rng.standard_normal((B, Lk, N, K)), dtype)
    v = jnp.asarray(rng.standard_normal((B, Lk, N, K)), dtype)
    mask = None
    if masked:  # different valid lengths per row; the last row attends to every key
        lens = rng.integers(1, Lk, size=B)
        lens[-1] = Lk
        mask = jnp.asarray(np.arange(Lk)[None, :] < lens[:, None])
    return q, k, v, mask


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float32), np.asarray(ref, np.float32)
    return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30))
