"""NVIDIA TransformerEngine fused attention (``transformer_engine.jax.flax.DotProductAttention``).

Layout BSHD (``qkv_layout="bshd_bshd_bshd"``, ``transpose_batch_sequence=False``); mask type
``no_mask`` or ``padding`` (from kv_mask); softmax scale passed as TE's ``scale_factor``;
``attention_dropout=0`` (Wan has none). The module runs with ``deterministic=False`` so TE
keeps the softmax statistics its backward needs; with dropout 0 nothing random happens.

Strict:
- no CUDA GPU, TE not installed, dtype not fp16/bf16, unsupported head dim →
  :class:`~ditax.attention.AttentionUnavailable` naming the condition and the fix;
- TE silently runs an unfused jnp path unless ``NVTE_FUSED_ATTN=1``, and warns and falls back
  when no fused kernel fits; both are turned into AttentionUnavailable here.
- TE's padding mask only describes *right* padding (valid keys first); kv_mask must be a
  prefix mask. A non-prefix mask is not detected (it is a traced value).

Entry-point configuration (never from inside a layer; DESIGN rule 11)::

    from ditax.attention.te import configure_te
    with configure_te(mesh):          # the CLI does this visibly around generate/train
        run(...)

:func:`configure_te` sets ``NVTE_FUSED_ATTN=1`` and enters TE's ``global_shard_guard`` with a
``MeshResource`` that maps TE's logical resources onto our mesh axes: ``dp_resource="data"``,
``fsdp_resource="fsdp"``, ``tp_resource="tensor"``, ``cp_resource="context"`` (axes of size 1
or absent are left as None). TE's context-parallel attention (``context_parallel_axis``)
reads ``cp_resource``; recent TE versions require *some* MeshResource to be set even on one
GPU. Partitioner: jax ≥ 0.7 defaults to Shardy; TE ≥ 2.3 ships Shardy rules for its custom
calls. With an older TE pass ``use_shardy=False`` to switch jax to GSPMD (a global flag, so it
happens here at the entry point, logged).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

import jax.numpy as jnp

from ditax.attention import platform
from ditax.attention.cudnn import check_cudnn_inputs, require_cuda

log = logging.getLogger(__name__)

_FIX_TE = "install ditax[gpu] (transformer-engine[jax]) on a CUDA machine, or use backend='xla'"
MESH_TO_TE = {"data": "dp_resource", "fsdp": "fsdp_resource", "tensor": "tp_resource",
              "context": "cp_resource"}


def _require_te():
    from ditax.attention import AttentionUnavailable

    require_cuda("te")
    if not platform.has_transformer_engine_jax():
        raise AttentionUnavailable(
            "attention backend 'te' is unavailable: transformer_engine.jax is not importable; "
            + _FIX_TE)
    if os.environ.get("NVTE_FUSED_ATTN") != "1":
        raise AttentionUnavailable(
            "attention backend 'te': TE fused attention is off (NVTE_FUSED_ATTN is not '1', "
            "so TE would silently run its unfused path); call "
            "ditax.attention.te.configure_te(mesh) at the entry point, or set "
            "NVTE_FUSED_ATTN=1")


def te_attention(q, k, v, *, kv_mask=None, scale=None):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` (prefix) → ``[B, Lq, N, K]``."""
    from ditax.attention import AttentionUnavailable

    _require_te()
    check_cudnn_inputs(q, "te", platform.cuda_compute_capability())
    from transformer_engine.jax.flax import DotProductAttention

    B, Lq, N, K = q.shape
    scale = float(K ** -0.5 if scale is None else scale)
    module = DotProductAttention(
        head_dim=K, num_attention_heads=N, num_gqa_groups=N, attention_dropout=0.0,
        attn_mask_type="no_mask" if kv_mask is None else "padding",
        qkv_layout="bshd_bshd_bshd", transpose_batch_sequence=False, scale_factor=scale,
        dtype=q.dtype)
    # TE's mask: True = masked out, [B, 1, Lq, Lk]; it converts it to per-row lengths.
    mask = None if kv_mask is None else jnp.broadcast_to(
        ~kv_mask.astype(bool)[:, None, None, :], (B, 1, Lq, k.shape[1]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o = module.apply({}, q, k, v, mask, deterministic=False)
    for w in caught:
        if "Fused attention is not enabled" in str(w.message):
            raise AttentionUnavailable(
                f"attention backend 'te': TE has no fused kernel for q{tuple(q.shape)} "
                f"k{tuple(k.shape)} {jnp.dtype(q.dtype).name} (it would fall back to unfused "
                f"attention); update TE/cuDNN or use backend='cudnn'")
    if kv_mask is not None:
        o = jnp.where(jnp.any(kv_mask, axis=1)[:, None, None, None], o, jnp.zeros_like(o))
    return o


def te_mesh_resource_kwargs(mesh) -> dict:
    """The ``MeshResource(**kwargs)`` for our ``(data, fsdp, context, tensor)`` mesh."""
    if mesh is None:
        return {}
    shape = dict(mesh.shape)
    return {field: axis for axis, field in MESH_TO_TE.items() if shape.get(axis, 1) > 1}


@contextlib.contextmanager
def configure_te(mesh=None, *, use_shardy: bool | None = None):
    """Entry-point setup for the ``te`` backend (call from the CLI / script, not a layer).

    Sets ``NVTE_FUSED_ATTN=1``, optionally switches jax's partitioner, and holds TE's global
    MeshResource (see the module docstring) for the duration of the ``with`` block.
    """
    os.environ["NVTE_FUSED_ATTN"] = "1"
    if use_shardy is not None:
        import jax

        jax.config.update("jax_use_shardy_partitioner", bool(use_shardy))
        log.info("configure_te: jax_use_shardy_partitioner=%s", use_shardy)
    if not platform.has_transformer_engine_jax():
        log.info("configure_te: transformer_engine.jax not installed; only NVTE_FUSED_ATTN set")
        yield None
        return
    from transformer_engine.jax.sharding import MeshResource, global_shard_guard

    resource = MeshResource(**te_mesh_resource_kwargs(mesh))
    log.info("configure_te: NVTE_FUSED_ATTN=1, %s", resource)
    with global_shard_guard(resource):
        yield resource


def uses_te(attention_cfg) -> bool:
    """Whether any attention path of an :class:`~ditax.config.AttentionConfig` is ``te``."""
    a = attention_cfg
    return "te" in (a.backend, a.cross_backend, a.short_cross_backend) or (
        a.backend in ("ulysses", "ring", "ulysses_ring") and a.local == "te")


def entry_context(attention_cfg, mesh=None, say=print):
    """What an entry point (``ditax generate`` / ``train`` / ``bench``) wraps its work in:
    :func:`configure_te` when the config uses ``te`` (announced with ``say``), otherwise a
    no-op context."""
    if not uses_te(attention_cfg):
        return contextlib.nullcontext()
    shardy = getattr(attention_cfg, "te_shardy", None)
    say("attention te: setting NVTE_FUSED_ATTN=1 and TransformerEngine's MeshResource "
        f"{te_mesh_resource_kwargs(mesh) or '(single device)'}"
        + ("" if shardy is None else f"; jax_use_shardy_partitioner={shardy}"))
    return configure_te(mesh, use_shardy=shardy)
