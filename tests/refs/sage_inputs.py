"""Inputs with DiT-like statistics and the error measures the 8-bit attention tests share."""

import jax.numpy as jnp
import numpy as np

from ditax.attention.reference import reference_attention


def realistic(rng, B, Lq, Lk, N, K, dtype=jnp.bfloat16, score_std=2.0):
    """DiT-like statistics: scores with std ``score_std`` (peaked, not uniform attention),
    K with a large per-channel offset shared by every token (what smoothing removes), V with
    a per-channel offset too."""
    q = score_std * rng.standard_normal((B, Lq, N, K))
    k = rng.standard_normal((B, Lk, N, K)) + 3.0 * rng.standard_normal((1, 1, N, K))
    v = rng.standard_normal((B, Lk, N, K)) + rng.standard_normal((1, 1, N, K))
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def frob(x, ref):
    x, ref = np.asarray(x, np.float32), np.asarray(ref, np.float32)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def exact(q, k, v, mask=None):
    f = lambda x: x.astype(jnp.float32)   # noqa: E731
    return reference_attention(f(q), f(k), f(v), kv_mask=mask, return_lse=True)
