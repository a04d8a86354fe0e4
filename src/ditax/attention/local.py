"""A local attention kernel bound to its options, as dispatch, the sharded (mesh) wrapper and
the sequence-parallel engine call it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp

from ditax.attention.options import Options
from ditax.attention.registry import Backend


@dataclass(frozen=True)
class LocalRun:
    """``run(q, k, v, mask, scale, prev=None) -> o`` (or ``(o, lse [B, N, L])`` with
    ``need_lse``) for one local backend and its resolved options.

    ``prev = (o [B, L, N, K] float32, lse [B, N, L])``: continue the online softmax from a
    previous partial (only for a backend that ``carries``, i.e. flash). ``head_major``: q/k/v,
    o and prev's o are ``[B, N, L, K]`` instead (a kernel that reads that layout,
    :attr:`Backend.head_major`, gets it as is, others through transposes). When the ring needs
    the log-sum-exp and the kernel cannot return it (``lse="beside"``, xla), lse is computed
    next to it in jnp from the same scores (one extra ``QK^T``; documented, not hidden).
    """

    entry: Backend
    options: Options
    need_lse: bool = False
    head_major: bool = False   # q/k/v, o (and prev's o) are [B, N, L, K]; lse stays [B, N, L]

    @property
    def name(self) -> str:
        return self.entry.name

    def __call__(self, q, k, v, mask, scale, prev=None):
        if self.head_major and not self.entry.head_major:   # a BSHD kernel: transposed
            t = lambda x: jnp.swapaxes(x, 1, 2)   # noqa: E731
            bshd = replace(self, head_major=False)
            out = bshd(t(q), t(k), t(v), mask, scale,
                       None if prev is None else (t(prev[0]), prev[1]))
            return (t(out[0]), out[1]) if isinstance(out, tuple) else t(out)
        fn, kw = self.entry.load(), self.options.kwargs()
        if self.head_major:
            kw["head_major"] = True
        if prev is not None:
            return fn(q, k, v, kv_mask=mask, scale=scale, return_lse=True, o_prev=prev[0],
                      lse_prev=prev[1], **kw)
        if not self.need_lse:
            return fn(q, k, v, kv_mask=mask, scale=scale, **kw)
        if self.entry.lse == "kernel":
            return fn(q, k, v, kv_mask=mask, scale=scale, return_lse=True, **kw)
        return fn(q, k, v, kv_mask=mask, scale=scale, **kw), lse_beside(q, k, mask, scale)


def lse_beside(q, k, mask, scale):
    """float32 log-sum-exp ``[B, N, L]`` of q ``[B, L, N, K]`` against k ``[B, T, N, K]``."""
    s = jnp.einsum("blnk,btnk->bnlt", q.astype(jnp.float32), k.astype(jnp.float32))
    s = s * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        s = s + jnp.where(mask, 0.0, -jnp.inf).astype(jnp.float32)[:, None, None, :]
    return jax.nn.logsumexp(s, axis=-1)


__all__ = ["LocalRun", "lse_beside"]
