"""Attention backends behind one strict dispatch: ``attend(q, k, v, backend=...)``.

Shapes (DESIGN rule 3): q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` bool
(True = attend), output ``[B, Lq, N, K]`` in q's dtype.

Every backend module exposes one function registered in :data:`BACKENDS`. A backend that
cannot run here raises :class:`AttentionUnavailable` naming the backend, the unmet condition
and the fix; nothing silently runs another kernel. ``backend="auto"`` picks the platform
default (TPU → splash, GPU → cudnn, CPU → xla) and logs the choice once.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Callable

import jax

log = logging.getLogger(__name__)


from ditax.errors import AttentionUnavailable  # noqa: E402  (re-exported)


# name -> "module:function" (imported lazily so optional dependencies stay optional)
BACKENDS: dict[str, str] = {
    "reference": "ditax.attention.reference:reference_attention",
    "xla": "ditax.attention.xla:xla_attention",
    "blockwise": "ditax.attention.blockwise:blockwise_attention",
    "splash": "ditax.attention.splash:splash_attention",
    "flash": "ditax.attention.flash:flash_attention",
    "cudnn": "ditax.attention.cudnn:cudnn_attention",
    "te": "ditax.attention.te:te_attention",
    "ulysses": "ditax.attention.ulysses:ulysses_attention",
    "ring": "ditax.attention.ring:ring_attention",
    "ulysses_ring": "ditax.attention.ulysses_ring:ulysses_ring_attention",
}

PARALLEL = ("ulysses", "ring", "ulysses_ring")
_auto_logged: set[str] = set()


def auto_backend(platform: str | None = None) -> str:
    """Platform default: TPU → splash, GPU → cudnn, otherwise xla."""
    platform = platform or jax.default_backend()
    choice = {"tpu": "splash", "gpu": "cudnn", "cuda": "cudnn"}.get(platform, "xla")
    if platform not in _auto_logged:
        _auto_logged.add(platform)
        log.info("attention backend=auto on %s -> %s", platform, choice)
    return choice


def get_backend(name: str) -> Callable:
    if name == "auto":
        name = auto_backend()
    if name not in BACKENDS:
        import difflib

        close = difflib.get_close_matches(name, list(BACKENDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown attention backend {name!r}{hint}; "
                         f"choose one of: auto, {', '.join(BACKENDS)}")
    mod_name, fn_name = BACKENDS[name].split(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("ditax"):
            raise AttentionUnavailable(
                f"attention backend {name!r} is not implemented in this build ({e.name}); "
                f"use backend='xla'") from None
        raise
    return getattr(mod, fn_name)


def attend(q, k, v, *, backend: str = "xla", mesh=None, kv_mask=None, scale=None, **options):
    """Multi-head attention through the named backend.

    Args:
      q: ``[B, Lq, N, K]``; k, v: ``[B, Lk, N, K]``.
      backend: one of ``auto`` and :data:`BACKENDS`.
      mesh: the device mesh; required by the sequence-parallel backends.
      kv_mask: optional ``[B, Lk]`` bool, True where a key may be attended.
      scale: softmax scale, default ``1/sqrt(K)``.
      options: backend options (``local``, ``out_a2a``, ``ulysses_shards``, ``block_q``...).
        An option the backend does not take is an error, never ignored.
    Returns ``[B, Lq, N, K]`` in q's dtype.
    """
    check_shapes(q, k, v, kv_mask)
    fn = get_backend(backend)
    params = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        bad = sorted(set(options) - set(params))
        if bad:
            takes = sorted(n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
                           and n not in ("kv_mask", "scale", "mesh"))
            raise TypeError(f"attention backend {backend!r} does not take option(s) {bad}; "
                            f"it takes {takes}")
    kw = dict(options)
    if "mesh" in params:
        kw["mesh"] = mesh
    elif mesh is not None:
        return sharded_local_attention(fn, q, k, v, mesh=mesh, kv_mask=kv_mask, scale=scale,
                                       **kw)
    return fn(q, k, v, kv_mask=kv_mask, scale=scale, **kw)


def sharded_local_attention(fn, q, k, v, *, mesh, kv_mask=None, scale=None, **options):
    """A local kernel on a mesh: ``shard_map`` over batch ``(data, fsdp)``, heads ``tensor``
    and query sequence ``context``; K/V (and kv_mask) are whole along the sequence.

    This is how a local backend runs under a mesh: Pallas and cuDNN/TE kernels are opaque to
    XLA's partitioner (which would otherwise replicate their inputs on every device). For
    cross-attention, text K/V are replicated over ``context`` and nothing is exchanged; for
    self-attention with a sequence-sharded q, K/V are all-gathered over ``context`` at the
    ``shard_map`` boundary (use ``ulysses`` / ``ring`` to avoid that). A query length that
    does not divide ``context`` is padded and the padded rows dropped.
    """
    from jax.sharding import PartitionSpec as P

    b, lq, n, _ = q.shape
    shape = dict(mesh.shape)
    nb = shape.get("data", 1) * shape.get("fsdp", 1)
    tp = shape.get("tensor", 1)
    c = shape.get("context", 1)
    if b % nb:
        raise ValueError(f"attention on a mesh: batch {b} is not divisible by data*fsdp = {nb}; "
                         f"use a batch that is a multiple of {nb} or a smaller data/fsdp mesh")
    if n % tp:
        raise ValueError(f"attention on a mesh: {n} heads are not divisible by tensor = {tp}")
    pad = (-lq) % c
    if pad:
        q = jax.numpy.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    batch = tuple(a for a in ("data", "fsdp") if shape.get(a, 1) > 1) or None
    heads = "tensor" if tp > 1 else None
    seq = "context" if c > 1 else None
    q_spec = P(batch, seq, heads, None)
    kv_spec = P(batch, None, heads, None)

    def body(q, k, v, *m):
        return fn(q, k, v, kv_mask=m[0] if m else None, scale=scale, **options)

    args = (q, k, v) + (() if kv_mask is None else (kv_mask,))
    specs = (q_spec, kv_spec, kv_spec) + (() if kv_mask is None else (P(batch, None),))
    out = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=q_spec,
                        check_vma=False)(*args)
    return out[:, :lq] if pad else out


def check_shapes(q, k, v, kv_mask=None):
    """Raise ValueError unless q/k/v/kv_mask have the BSHD shapes ``attend`` takes."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention expects q/k/v of rank 4 [B, L, N, K]; got q{q.shape} "
                         f"k{k.shape} v{v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k{k.shape} and v{v.shape} must have the same shape")
    if q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"q{q.shape} and k{k.shape} must agree on batch, heads and head dim")
    if kv_mask is not None and tuple(kv_mask.shape) != (k.shape[0], k.shape[1]):
        raise ValueError(f"kv_mask{tuple(kv_mask.shape)} must be [B, Lk] = "
                         f"{(k.shape[0], k.shape[1])}")


__all__ = ["attend", "sharded_local_attention", "auto_backend", "get_backend", "check_shapes", "BACKENDS",
           "AttentionUnavailable", "PARALLEL"]
