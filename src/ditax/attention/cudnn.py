"""cuDNN fused flash attention through ``jax.nn.dot_product_attention(implementation="cudnn")``.

Strict: off a CUDA target platform, or with inputs cuDNN's flash kernel does not take, it
raises :class:`~ditax.errors.AttentionUnavailable` naming the value and the fix; it never
falls back to another implementation.

cuDNN flash-attention limits (as checked by jax's ``fused_attention_stablehlo``, declared in
the registry entry): q/k/v float16 or bfloat16; head dim K a multiple of 8 and at most 128
(at most 256 on compute capability ≥ 9.0, i.e. Hopper and later).

What this wrapper adapts (:func:`length_masked_attention`, shared with the CPU tests, which
run it with jax's ``xla`` implementation against the reference):

- **key masks as lengths.** A mask or bias reaches cuDNN only as ``[..., Lq, Lk]`` (a
  ``[B, 1, 1, Lk]`` bias is rejected) and its gradient would be materialised; Wan's masks are
  prefix masks, so they go in as ``key_value_seq_lengths`` (cuDNN's padding mask, no tensor).
  A non-prefix mask is refused (see :mod:`ditax.attention.lengths`).
- **any Lq, Lk.** jax binds a placeholder bias, so cuDNN's backward rule "with a bias, Lq and
  Lk even" always applies (``Unsupported sequence length Q 999, KV 999``). An odd length is
  padded by one: the padded key is excluded by the key length, the padded query row by the
  query length and sliced off. Forward and backward see the same padded shapes.
- rows whose keys are all masked return zeros, as the reference (cuDNN is given one key
  there, whose contribution is then dropped, so no NaN reaches its backward).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ditax.attention.lengths import finish_rows, key_lengths
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


def cudnn_attention(q, k, v, *, kv_mask=None, scale=None):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` (a prefix mask) →
    ``[B, Lq, N, K]`` in q's dtype, on cuDNN (any Lq, Lk; forward and gradient)."""
    BACKENDS["cudnn"].require(platform_of(), dtype=q.dtype, head_dim=q.shape[-1])
    return length_masked_attention(q, k, v, kv_mask=kv_mask, scale=scale,
                                   implementation="cudnn")


def _pad_to_even(x):
    if x.shape[1] % 2 == 0:
        return x
    return jnp.pad(x, ((0, 0), (0, 1), (0, 0), (0, 0)))


def length_masked_attention(q, k, v, *, kv_mask=None, scale=None,
                            implementation: str = "cudnn"):
    """``jax.nn.dot_product_attention`` with even padded lengths and the key mask as
    per-row lengths (see the module docstring). ``implementation="xla"`` runs the same
    adaptation on any platform (the CPU tests and ``benchmarks/gpu_check.py --dry``)."""
    B, Lq = q.shape[:2]
    Lk = k.shape[1]
    lengths, prefix_ok = (None, None) if kv_mask is None else key_lengths(kv_mask, "cudnn")
    kw = {}
    if lengths is not None or Lq % 2 or Lk % 2:
        kv_len = (jnp.full((B,), Lk, jnp.int32) if lengths is None
                  else jnp.maximum(lengths, 1))
        kw = dict(query_seq_lengths=jnp.full((B,), Lq, jnp.int32),
                  key_value_seq_lengths=kv_len)
    o = jax.nn.dot_product_attention(_pad_to_even(q), _pad_to_even(k), _pad_to_even(v),
                                     scale=scale, implementation=implementation, **kw)
    return finish_rows(o[:, :Lq], lengths, prefix_ok)


__all__ = ["cudnn_attention", "length_masked_attention", "check_cudnn_inputs"]
