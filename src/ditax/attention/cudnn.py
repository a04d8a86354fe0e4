"""cuDNN fused flash attention through ``jax.nn.dot_product_attention(implementation="cudnn")``.

Strict: off a CUDA target platform, or with inputs cuDNN's flash kernel does not take, it
raises :class:`~ditax.errors.AttentionUnavailable` naming the value and the fix; it never
falls back to another implementation.

cuDNN flash-attention limits (as checked by jax's ``fused_attention_stablehlo``, declared in
the registry entry): q/k/v float16 or bfloat16; head dim K a multiple of 8 and at most 128
(at most 256 on compute capability ≥ 9.0, i.e. Hopper and later). With a bias (our
``kv_mask_mode="bias"``) the backward pass also needs even Lq and Lk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ditax.attention.options import CudnnOptions
from ditax.attention.registry import BACKENDS
from ditax.errors import AttentionUnavailable
from ditax.parallel.platform import Platform, platform_of


def check_cudnn_inputs(q, backend: str = "cudnn",
                       compute_capability: tuple[int, int] | None = None) -> None:
    """Raise AttentionUnavailable unless q's dtype and head dim suit cuDNN flash attention
    (on a CUDA device of ``compute_capability``)."""
    entry = BACKENDS[backend]
    plat = Platform("cuda", compute_capability)
    why = entry.refusal(plat, dtype=q.dtype, head_dim=q.shape[-1])
    if why is not None:
        raise AttentionUnavailable(why)


def cudnn_attention(q, k, v, *, kv_mask=None, scale=None,
                    kv_mask_mode: str = CudnnOptions.kv_mask_mode):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` → ``[B, Lq, N, K]``.

    Args:
      kv_mask_mode: how kv_mask reaches cuDNN. ``"bias"``: any mask, as an additive
        ``[B, 1, 1, Lk]`` bias (backward needs even lengths). ``"lengths"``: the mask must be
        a prefix (valid keys first); passed as per-row key lengths (cuDNN padding mask, no
        bias tensor, no parity constraint). A non-prefix mask in this mode is wrong, not
        detected.
    """
    BACKENDS["cudnn"].require(platform_of(), dtype=q.dtype, head_dim=q.shape[-1])
    if kv_mask_mode not in ("bias", "lengths"):
        raise ValueError(f"kv_mask_mode={kv_mask_mode!r}; choose 'bias' or 'lengths'")
    kw = {}
    if kv_mask is not None:
        if kv_mask_mode == "bias":
            kw["mask"] = kv_mask[:, None, None, :].astype(bool)
        else:
            kw["key_value_seq_lengths"] = jnp.sum(kv_mask, axis=1, dtype=jnp.int32)
    o = jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn", **kw)
    if kv_mask is not None:  # rows without any key: zeros, as the reference
        o = jnp.where(jnp.any(kv_mask, axis=1)[:, None, None, None], o, jnp.zeros_like(o))
    return o
