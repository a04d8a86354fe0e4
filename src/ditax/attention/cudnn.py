"""cuDNN fused flash attention through ``jax.nn.dot_product_attention(implementation="cudnn")``.

Strict: without a CUDA GPU, or with inputs cuDNN's flash kernel does not take, it raises
:class:`~ditax.attention.AttentionUnavailable` naming the value and the fix; it never falls
back to another implementation.

cuDNN flash-attention limits (as checked by jax's ``fused_attention_stablehlo``): q/k/v
float16 or bfloat16; head dim K a multiple of 8 and at most 128 (at most 256 on compute
capability ≥ 9.0, i.e. Hopper and later). With a bias (our ``kv_mask_mode="bias"``) the
backward pass also needs even Lq and Lk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ditax.attention import platform

_FIX_GPU = "install ditax[gpu] on a CUDA machine, or use backend='xla'"


def head_dim_limit(compute_capability: tuple[int, int] | None) -> int:
    """Largest head dim cuDNN flash attention takes: 256 from Hopper (9.0) on, else 128."""
    return 256 if compute_capability is not None and compute_capability >= (9, 0) else 128


def check_cudnn_inputs(q, backend: str = "cudnn",
                       compute_capability: tuple[int, int] | None = None) -> None:
    """Raise AttentionUnavailable unless q's dtype and head dim suit cuDNN flash attention."""
    from ditax.attention import AttentionUnavailable

    if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise AttentionUnavailable(
            f"attention backend {backend!r} needs float16 or bfloat16 q/k/v, got "
            f"{jnp.dtype(q.dtype).name}; cast the inputs (e.g. model dtype='bfloat16') "
            f"or use backend='xla'")
    K = q.shape[-1]
    limit = head_dim_limit(compute_capability)
    if K % 8 or K > limit:
        raise AttentionUnavailable(
            f"attention backend {backend!r}: head dim K={K} is not supported by cuDNN flash "
            f"attention (needs a multiple of 8 and <= {limit} on this GPU); "
            f"use backend='xla' or 'blockwise'")


def require_cuda(backend: str) -> None:
    """Raise AttentionUnavailable (condition + fix) when no CUDA GPU is visible."""
    from ditax.attention import AttentionUnavailable

    if not platform.has_cuda_gpu():
        raise AttentionUnavailable(
            f"attention backend {backend!r} is unavailable: {platform.no_cuda_reason()}; "
            f"{_FIX_GPU}")


def cudnn_attention(q, k, v, *, kv_mask=None, scale=None, kv_mask_mode: str = "bias"):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` → ``[B, Lq, N, K]``.

    Args:
      kv_mask_mode: how kv_mask reaches cuDNN. ``"bias"``: any mask, as an additive
        ``[B, 1, 1, Lk]`` bias (backward needs even lengths). ``"lengths"``: the mask must be
        a prefix (valid keys first); passed as per-row key lengths (cuDNN padding mask, no
        bias tensor, no parity constraint). A non-prefix mask in this mode is wrong, not
        detected.
    """
    require_cuda("cudnn")
    check_cudnn_inputs(q, "cudnn", platform.cuda_compute_capability())
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
