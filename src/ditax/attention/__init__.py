"""Attention backends behind one strict dispatch: ``attend(q, k, v, backend=...)``.

Shapes (DESIGN rule 3): q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` bool
(True = attend), output ``[B, Lq, N, K]`` in q's dtype. Einsums in this package write query
tokens ``l`` and key tokens ``t`` (``"blnk,btnk->bnlt"``).

Layout of the package:

- :mod:`~ditax.attention.registry` — every backend with its declared capabilities
  (:data:`BACKENDS`); :mod:`~ditax.attention.options` — one frozen options class each;
- one module per local kernel: ``reference``, ``xla``, ``blockwise``, ``splash``, ``flash``
  (+ ``kernels/``), ``cudnn``, ``te``;
- :mod:`~ditax.attention.sequence` — ``ulysses`` / ``ring`` / ``ulysses_ring``: a pure plan
  (:func:`plan_sequence_parallel`) and its execution;
- :mod:`~ditax.attention.local` — a kernel bound to its options;
  :mod:`~ditax.attention.sharded` — a local kernel on a mesh (``shard_map``);
- :mod:`~ditax.attention.plan` — :class:`AttentionPlan` (built once per model from an
  :class:`AttentionConfig` and the mesh) and :class:`AttentionCall`;
- :func:`check_available` — will the configured backends run on the target platform?

A resolved call (:class:`AttentionCall`, what a model's plan holds) also takes head-major
q/k/v ``[B, N, L, K]`` (``call(q, k, v, head_major=True)``, the same values): the layout the
TPU kernels (flash, splash, and the sequence backends around them) read and write in place,
which a model's projections can write directly (``call.reads_head_major`` says when to).

A backend that cannot run here raises :class:`AttentionUnavailable` naming the backend, the
unmet condition and the fix; nothing silently runs another kernel. ``backend="auto"`` picks
the target platform's default for the inputs' dtype and head dim (TPU → splash; CUDA → cudnn,
or blockwise where cuDNN refuses them, e.g. float32; else xla) and logs it once.
The target platform is :func:`ditax.parallel.platform.platform_of` (``ditax.target_platform``
overrides it).
"""

from __future__ import annotations

from ditax.attention.available import check_available
from ditax.attention.config import AttentionConfig
from ditax.attention.plan import AttentionCall, AttentionPlan, plan_attention, resolve
from ditax.attention.registry import BACKENDS, Backend, auto_backend
from ditax.attention.sequence import SequencePlan, plan_sequence_parallel
from ditax.errors import AttentionUnavailable, ConfigError, DitaxError, RequestError


def attend(q, k, v, *, backend: str = "xla", mesh=None, kv_mask=None, scale=None, **options):
    """Multi-head attention through the named backend.

    Args:
      q: ``[B, Lq, N, K]``; k, v: ``[B, Lk, N, K]``.
      backend: ``auto`` or a name in :data:`BACKENDS`.
      mesh: the device mesh; required by the sequence-parallel backends. A local backend
        given a mesh runs under ``shard_map`` (batch, sequence and heads sharded).
      kv_mask: optional ``[B, Lk]`` bool, True where a key may be attended.
      scale: softmax scale, default ``1/sqrt(K)``.
      options: the backend's options (its class in :mod:`ditax.attention.options`, e.g.
        ``local``, ``out_a2a``, ``ulysses_shards``, ``block_q``; a sequence backend also takes
        its local kernel's, e.g. ``fused_bwd`` with ``local="splash"``) — the same names as
        the ``attention.<option>`` config keys. An option the backend does not take is an
        :class:`~ditax.attention.options.OptionError` (a ConfigError and a TypeError) naming
        the ones it takes, in the words the config check uses; never ignored.
    Returns ``[B, Lq, N, K]`` in q's dtype. Wrong shapes or a scale that is no positive
    finite number are a :class:`~ditax.errors.RequestError`; a backend or option that cannot
    be used (unknown name, no mesh for a parallel one, a block size the kernel refuses) a
    :class:`~ditax.errors.ConfigError` (both ``ValueError``).
    """
    import math

    if isinstance(scale, (int, float)) and (isinstance(scale, bool) or not math.isfinite(scale)
                                            or scale <= 0):
        raise RequestError(f"attend(scale={scale!r}): the softmax scale must be a positive "
                           f"finite number (default 1/sqrt(K)); pass scale=None for it")
    try:
        call = resolve(backend, options, mesh=mesh, dtype=q.dtype, head_dim=q.shape[-1])
    except DitaxError:
        raise
    except ValueError as e:          # the choice's own rule, named by its owner's message
        raise ConfigError(str(e)) from e
    return call(q, k, v, kv_mask=kv_mask, scale=scale)


__all__ = ["attend", "check_available", "plan_attention", "AttentionPlan", "AttentionCall",
           "AttentionConfig", "AttentionUnavailable", "BACKENDS", "Backend", "auto_backend",
           "plan_sequence_parallel", "SequencePlan"]
