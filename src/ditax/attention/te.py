"""NVIDIA TransformerEngine fused attention (``transformer_engine.jax.flax.DotProductAttention``).

Layout BSHD (``qkv_layout="bshd_bshd_bshd"``, ``transpose_batch_sequence=False``); mask type
``no_mask`` or ``padding`` (from kv_mask); softmax scale passed as TE's ``scale_factor``;
``attention_dropout=0`` (Wan has none). The module runs with ``deterministic=False`` so TE
keeps the softmax statistics its backward needs; with dropout 0 nothing random happens.

Strict:
- no CUDA GPU, TE not installed, dtype not fp16/bf16, unsupported head dim →
  :class:`~ditax.errors.AttentionUnavailable` naming the condition and the fix (the
  capabilities are declared in the registry entry);
- TE silently runs an unfused jnp path unless ``NVTE_FUSED_ATTN=1``, and warns and falls back
  when no fused kernel fits; both are turned into AttentionUnavailable here.
- TE's padding mask only describes *right* padding (valid keys first); kv_mask must be a
  prefix mask. A non-prefix mask is not detected (it is a traced value).

Entry-point configuration (never from inside a layer; DESIGN rule 11)::

    from ditax.attention.te import configure_te
    with configure_te(mesh):          # the CLI does this visibly around generate/train
        run(...)

:func:`configure_te` is scoped: it sets ``NVTE_FUSED_ATTN=1`` (and, when asked, jax's
partitioner flag) for the ``with`` block only and restores both on exit, so no process-wide
state is left behind. Inside, it enters TE's ``global_shard_guard`` with a
``MeshResource`` that maps TE's logical resources onto our mesh axes: ``dp_resource="data"``,
``fsdp_resource="fsdp"``, ``tp_resource="tensor"``, ``cp_resource="context"`` (axes of size 1
or absent are left as None). TE's context-parallel attention (``context_parallel_axis``)
reads ``cp_resource``; recent TE versions require *some* MeshResource to be set even on one
GPU. Partitioner: jax ≥ 0.7 defaults to Shardy; TE ≥ 2.3 ships Shardy rules for its custom
calls. With an older TE pass ``use_shardy=False`` to switch jax to GSPMD inside the block (a
global jax flag, so it happens here at the entry point, logged, and is restored on exit).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

import jax
import jax.numpy as jnp

from ditax.attention import platform
from ditax.attention.config import PARALLEL_BACKENDS
from ditax.attention.registry import BACKENDS
from ditax.errors import AttentionUnavailable
from ditax.parallel.axes import HEADS_AXIS, SEQ_AXIS
from ditax.parallel.mesh import BATCH_AXES
from ditax.parallel.platform import platform_of

log = logging.getLogger(__name__)

# our mesh axes -> TE's MeshResource fields
MESH_TO_TE = {BATCH_AXES[0]: "dp_resource", BATCH_AXES[1]: "fsdp_resource",
              HEADS_AXIS: "tp_resource", SEQ_AXIS: "cp_resource"}


def _require_te(q):
    """CUDA target, TE importable, fp16/bf16 and a supported head dim (registry), and TE's
    fused attention switched on."""
    BACKENDS["te"].require(platform_of(), dtype=q.dtype, head_dim=q.shape[-1])
    if os.environ.get("NVTE_FUSED_ATTN") != "1":
        raise AttentionUnavailable(
            "attention backend 'te': TE fused attention is off (NVTE_FUSED_ATTN is not '1', "
            "so TE would silently run its unfused path); wrap the run in "
            "ditax.attention.te.configure_te(mesh) at the entry point, or set "
            "NVTE_FUSED_ATTN=1")


def te_attention(q, k, v, *, kv_mask=None, scale=None):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` (prefix) →
    ``[B, Lq, N, K]``."""
    _require_te(q)
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
def _env(name: str, value: str):
    """``os.environ[name] = value`` inside the block; the previous value (or absence) after."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def _jax_flag(name: str, value):
    """``jax.config.update(name, value)`` inside the block; the previous value after."""
    old = getattr(jax.config, name)
    jax.config.update(name, value)
    try:
        yield
    finally:
        jax.config.update(name, old)


@contextlib.contextmanager
def configure_te(mesh=None, *, use_shardy: bool | None = None):
    """Entry-point setup for the ``te`` backend (call from the CLI / script, not a layer).

    For the ``with`` block: ``NVTE_FUSED_ATTN=1``, optionally jax's partitioner
    (``use_shardy``), and TE's global MeshResource (see the module docstring). Everything is
    restored on exit. Yields the MeshResource (None when TE is not installed).
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(_env("NVTE_FUSED_ATTN", "1"))
        if use_shardy is not None:
            stack.enter_context(_jax_flag("jax_use_shardy_partitioner", bool(use_shardy)))
            log.info("configure_te: jax_use_shardy_partitioner=%s (until the block ends)",
                     use_shardy)
        if not platform.has_transformer_engine_jax():
            log.info("configure_te: transformer_engine.jax not installed; only NVTE_FUSED_ATTN "
                     "set")
            yield None
            return
        from transformer_engine.jax.sharding import MeshResource, global_shard_guard

        resource = MeshResource(**te_mesh_resource_kwargs(mesh))
        log.info("configure_te: NVTE_FUSED_ATTN=1, %s", resource)
        stack.enter_context(global_shard_guard(resource))
        yield resource


def uses_te(attention_cfg) -> bool:
    """Whether any attention path of an :class:`~ditax.config.AttentionConfig` is ``te``."""
    a = attention_cfg
    return "te" in (a.backend, a.cross_backend) or (
        a.backend in PARALLEL_BACKENDS and a.local == "te")


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
