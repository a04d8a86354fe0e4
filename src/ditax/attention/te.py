"""NVIDIA TransformerEngine fused attention (``transformer_engine.jax.flax.DotProductAttention``)
through TE 2.x's public API.

The call (checked against the TE source of v2.18 and main/2.20.0.dev0; ``ditax[gpu]`` pins
``transformer-engine[jax]>=2.14,<3``; paths below are in ``transformer_engine/jax/``):

- ``DotProductAttention(head_dim=K, num_attention_heads=N, num_gqa_groups=N,
  attention_dropout=0, attn_mask_type="no_mask" | "padding", qkv_layout="bshd_bshd_bshd",
  transpose_batch_sequence=False, scale_factor=scale)``: layout BSHD, Wan has no dropout.
  No ``dtype=``: deprecated, and a ValueError when it differs from the inputs
  (``flax/transformer.py:761-776``).
- ``.apply({}, q, k, v, sequence_descriptor, deterministic=False)``: the 4th positional
  argument is ``sequence_descriptor`` (``flax/transformer.py:681-690``). An array there takes
  the deprecated mask path (``attention.py:1606``), which derives the q lengths from key
  column 0 and the kv lengths from query row 0 (``attention.py:1115-1119``). So the lengths
  go in as ``SequenceDescriptor.from_seqlens((q_lengths, kv_lengths))`` (``attention.py:938``),
  also without a mask (full lengths, with ``no_mask``: what TE's own mask path builds for it,
  ``attention.py:1110-1113``). ``deterministic=False`` is TE's training mode (it keeps the
  softmax statistics its backward needs); with dropout 0 nothing random happens.
- Key masks must be prefix masks (TE's padding mask is right padding); they become lengths
  as for ``cudnn`` (:mod:`ditax.attention.lengths`: a non-prefix mask is refused, or NaN
  when only known on the device).
- ``NVTE_FUSED_ATTN``: TE reads ``int(os.getenv("NVTE_FUSED_ATTN", "1"))``
  (``flax/transformer.py:779``; the default is "1" since TE 2.10): unset means fused, and
  ditax never sets it. An explicit ``NVTE_FUSED_ATTN=0`` (TE's unfused jnp path) is refused.
  When no fused kernel fits, TE warns and falls back to unfused attention
  (``flax/transformer.py:826-834``); that warning is turned into AttentionUnavailable.
- Partitioner: for jax > 0.9.1 TE registers only Shardy rules for its custom calls
  (``cpp_extensions/base.py:22-26, 255-259``), and Shardy is jax's default; ditax leaves
  jax's partitioner alone.
- Context parallelism is ditax's, not TE's: ``te`` runs inside ditax's ``shard_map`` (a local
  backend on a mesh, the local kernel of ``ulysses``, cross-attention of every sequence
  backend; the steps of a ``ring`` run ``blockwise``, see the registry), so TE sees one
  device's arrays; ``context_parallel_axis`` stays empty and TE does no CP of its own.
- TE asserts that a global ``MeshResource`` is set (``sharding.py:379``):
  :func:`configure_te` (or :func:`te_entry_context`, the registry entry's entry context
  that the CLI's run context enters) enters TE's ``global_shard_guard`` for the ``with``
  block; the guard restores the previous resource on exit (``sharding.py:355-370``).
  Nothing else is touched: no environment variable, no jax config, so nothing process-wide
  is left behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

import jax.numpy as jnp

from ditax.attention import platform
from ditax.attention.lengths import finish_rows, key_lengths
from ditax.attention.registry import BACKENDS
from ditax.errors import AttentionUnavailable
from ditax.parallel.axes import HEADS_AXIS, SEQ_AXIS
from ditax.parallel.mesh import BATCH_AXES
from ditax.parallel.platform import platform_of

log = logging.getLogger(__name__)

# our mesh axes -> TE's MeshResource fields
MESH_TO_TE = {BATCH_AXES[0]: "dp_resource", BATCH_AXES[1]: "fsdp_resource",
              HEADS_AXIS: "tp_resource", SEQ_AXIS: "cp_resource"}
_FALLBACK = "Fused attention is not enabled"     # TE's warning before its unfused fallback


def _require_te(q):
    """CUDA target, TE importable, fp16/bf16 and a supported head dim (registry), TE's
    fused attention not switched off, and TE's MeshResource set."""
    BACKENDS["te"].require(platform_of(), dtype=q.dtype, head_dim=q.shape[-1])
    if os.environ.get("NVTE_FUSED_ATTN", "1").strip() == "0":
        raise AttentionUnavailable(
            "attention backend 'te': NVTE_FUSED_ATTN=0 is set, so TE would run its unfused "
            "jnp attention; unset NVTE_FUSED_ATTN (TE fuses by default) or use backend='xla'")
    from transformer_engine.jax.sharding import global_mesh_resource

    try:
        global_mesh_resource()
    except AssertionError:
        raise AttentionUnavailable(
            "attention backend 'te': TransformerEngine's MeshResource is not set; wrap the "
            "run in ditax.attention.te.configure_te(mesh) at the entry point (the ditax CLI "
            "does)") from None


def te_module_kwargs(num_heads: int, head_dim: int, scale: float, masked: bool) -> dict:
    """The ``DotProductAttention(**kwargs)`` for one call (see the module docstring)."""
    return dict(head_dim=head_dim, num_attention_heads=num_heads, num_gqa_groups=num_heads,
                attention_dropout=0.0, attn_mask_type="padding" if masked else "no_mask",
                qkv_layout="bshd_bshd_bshd", transpose_batch_sequence=False,
                scale_factor=scale)


def te_attention(q, k, v, *, kv_mask=None, scale=None):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` (a prefix mask) →
    ``[B, Lq, N, K]`` in q's dtype."""
    _require_te(q)
    from transformer_engine.jax.attention import SequenceDescriptor
    from transformer_engine.jax.flax import DotProductAttention

    B, Lq, N, K = q.shape
    Lk = k.shape[1]
    scale = float(K ** -0.5 if scale is None else scale)
    lengths, prefix_ok = (None, None) if kv_mask is None else key_lengths(kv_mask, "te")
    kv_len = jnp.full((B,), Lk, jnp.int32) if lengths is None else jnp.maximum(lengths, 1)
    seqs = SequenceDescriptor.from_seqlens((jnp.full((B,), Lq, jnp.int32), kv_len))
    module = DotProductAttention(**te_module_kwargs(N, K, scale, lengths is not None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o = module.apply({}, q, k, v, seqs, deterministic=False)
    for w in caught:
        if _FALLBACK in str(w.message):
            raise AttentionUnavailable(
                f"attention backend 'te': TE has no fused kernel for q{tuple(q.shape)} "
                f"k{tuple(k.shape)} {jnp.dtype(q.dtype).name} (it would fall back to unfused "
                f"attention); update TE/cuDNN or use backend='cudnn'")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return finish_rows(o, lengths, prefix_ok)


def te_mesh_resource_kwargs(mesh) -> dict:
    """The ``MeshResource(**kwargs)`` for our ``(data, fsdp, context, tensor)`` mesh (axes of
    size 1 or absent are left out)."""
    if mesh is None:
        return {}
    shape = dict(mesh.shape)
    return {field: axis for axis, field in MESH_TO_TE.items() if shape.get(axis, 1) > 1}


@contextlib.contextmanager
def configure_te(mesh=None):
    """Entry-point setup for the ``te`` backend (call from the CLI / script, not a layer):
    TE's ``global_shard_guard`` with the ``MeshResource`` of ``mesh`` for the ``with`` block.
    Yields the MeshResource (None when TE is not installed: then nothing is set)."""
    if not platform.has_transformer_engine_jax():
        log.info("configure_te: transformer_engine.jax is not installed; nothing to set")
        yield None
        return
    from transformer_engine.jax.sharding import MeshResource, global_shard_guard

    resource = MeshResource(**te_mesh_resource_kwargs(mesh))
    log.info("configure_te: %s", resource)
    with global_shard_guard(resource):
        yield resource


def te_entry_context(mesh=None, say=print):
    """The ``te`` registry entry's entry context: :func:`configure_te` for ``mesh``,
    announced with ``say``. Entry points enter it through
    :func:`ditax.attention.plan.entry_context` when a configured attention path is ``te``."""
    say("attention te: TransformerEngine MeshResource "
        f"{te_mesh_resource_kwargs(mesh) or '(single device)'} for this run")
    return configure_te(mesh)
