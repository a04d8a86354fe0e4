"""One engine behind ``ulysses``, ``ring`` and ``ulysses_ring``: a ``(ring × ulysses)`` grid on
the ``context`` mesh axis.

The ``context`` devices (C of them) are viewed as ``R × U``: Ulysses all-to-alls inside each
group of ``U`` consecutive devices, a ring of ``R`` groups outside. ``ulysses`` is ``R = 1``,
``ring`` is ``U = 1``. Per device (inside ``jax.shard_map``):

1. Ulysses sequence→heads exchange (``U > 1``): the device now holds its ring group's
   ``U * Lc`` tokens for ``N / (T U)`` heads.
2. Local kernel over those tokens; with ``R > 1`` K/V (and their mask) rotate around the ring
   with ``ppermute`` and the partial results merge by log-sum-exp (online softmax). With
   ``local="flash"`` the merge happens inside the kernel (it continues from the previous
   step's output and lse), so every layout performs the same arithmetic on the same tiles
   and the ``out_a2a`` modes agree bit for bit; other kernels merge with
   :func:`merge_partials` (same layout in ``flat`` and ``chunked``, so they agree too).
3. Ulysses heads→sequence exchange in the requested ``out_a2a`` mode.

Batch stays sharded over ``(data, fsdp)``, heads over ``tensor``. Sequences that do not split
evenly are padded (padded keys masked, padded queries dropped), so every length works and
matches unpadded attention. ``R × U`` with both > 1 runs on a *view* of the mesh whose context
axis is reshaped into ``("context_ring", "context_ulysses")`` — the same devices in the same
order, so arrays sharded over ``context`` need no movement.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from ditax.attention.config import OUT_A2A_MODES
from ditax.parallel import collectives as col

log = logging.getLogger(__name__)

BATCH_AXES = ("data", "fsdp")
_logged: set = set()


def _log_once(key, msg, *args):
    if key not in _logged:
        _logged.add(key)
        log.info(msg, *args)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def check_out_a2a(out_a2a: str) -> None:
    if out_a2a not in OUT_A2A_MODES:
        raise ValueError(f"unknown out_a2a={out_a2a!r}; choose one of {', '.join(OUT_A2A_MODES)}")


def context_size(mesh) -> int:
    if mesh is None:
        raise ValueError("sequence-parallel attention needs mesh=...; build one with "
                         "ditax.parallel.make_mesh({'context': n})")
    if "context" not in mesh.shape:
        raise ValueError(f"mesh axes {tuple(mesh.shape)} have no 'context' axis; build the mesh "
                         f"with ditax.parallel.make_mesh")
    return mesh.shape["context"]


# ------------------------------------------------------------------ local kernels


def local_kernel(local: str, *, need_lse: bool, block_q: int, block_kv: int, interpret):
    """``fn(q, k, v, mask, scale, prev=None) -> o`` (or ``(o, lse [B, N, Lq])``) for a local
    backend name.

    The flash kernel gets the caller's (already effective) blocks and ``interpret``; other
    kernels taking ``block_q``/``block_kv`` get them too. When the ring needs the
    log-sum-exp and the kernel cannot return it (``xla``), lse is computed beside it in
    jnp from the same scores (one extra ``QK^T``; documented, not hidden).

    ``fn.carries`` is True when the kernel can continue an online softmax from a previous
    partial ``prev = (o [B, Lq, N, K] float32, lse [B, N, Lq])`` (flash): the ring then merges
    inside the kernel instead of with :func:`merge_partials`.
    """
    from ditax.attention import PARALLEL, get_backend

    if local in PARALLEL:
        raise ValueError(f"local={local!r} is itself a parallel backend; choose a local kernel "
                         f"(reference, xla, blockwise, splash, flash)")
    fn = get_backend(local)
    params = inspect.signature(fn).parameters
    kw = {}
    for name, val in (("block_q", block_q), ("block_kv", block_kv), ("interpret", interpret)):
        if name in params and val is not None:
            kw[name] = val
    has_lse = "return_lse" in params
    carries = has_lse and "o_prev" in params and "lse_prev" in params

    def run(q, k, v, mask, scale, prev=None):
        if prev is not None:
            return fn(q, k, v, kv_mask=mask, scale=scale, return_lse=True, o_prev=prev[0],
                      lse_prev=prev[1], **kw)
        if not need_lse:
            return fn(q, k, v, kv_mask=mask, scale=scale, **kw)
        if has_lse:
            return fn(q, k, v, kv_mask=mask, scale=scale, return_lse=True, **kw)
        if local == "xla":
            return fn(q, k, v, kv_mask=mask, scale=scale, **kw), _lse(q, k, mask, scale)
        raise ValueError(f"local={local!r} cannot return the log-sum-exp the ring merge needs; "
                         f"use local='flash', 'blockwise', 'reference' or 'xla'")

    run.carries = carries
    return run


def _lse(q, k, mask, scale):
    s = jnp.einsum("bqnk,blnk->bnql", q.astype(jnp.float32), k.astype(jnp.float32))
    s = s * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        s = s + jnp.where(mask, 0.0, -jnp.inf).astype(jnp.float32)[:, None, None, :]
    return jax.nn.logsumexp(s, axis=-1)


def merge_partials(o1, lse1, o2, lse2):
    """Combine two attention partials over disjoint key sets (float32).

    ``o`` ``[..., K]``, ``lse`` ``[...]``; -inf lse (no visible key) contributes nothing, and
    two empty partials give zeros with lse -inf.

    Exact to rounding, but *which* rounding depends on the layout: XLA CPU rewrites the
    division into a reciprocal multiply and LLVM contracts one of the two products of
    ``w1 o1 + w2 o2`` into an FMA — which one differs between ``[b, L, h, K]`` and
    ``[U, b, h, Lc, K]`` (measured: 1 ulp apart from the first merge on). So the flash
    paths do not use it; they merge inside the kernel (:func:`ring_loop` with ``init``).
    """
    m = jnp.maximum(lse1, lse2)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    w1, w2 = jnp.exp(lse1 - m_safe), jnp.exp(lse2 - m_safe)
    s = w1 + w2
    nonzero = s > 0
    o = (w1[..., None] * o1 + w2[..., None] * o2) / jnp.where(nonzero, s, 1.0)[..., None]
    lse = jnp.where(nonzero, m_safe + jnp.log(jnp.where(nonzero, s, 1.0)), -jnp.inf)
    return o, lse


def ring_loop(step, q, kv, axis: str, size: int, init=None):
    """Run ``step`` for each of the ``size`` K/V chunks of the ring.

    Chunk 0 is the device's own; ``kv`` (a pytree of K, V, mask) then moves one device along
    the ring per step (``size - 1`` ``ppermute`` rounds, none wasted). Returns float32
    ``(o, lse)`` over all chunks.

    Two ways to combine the chunks:

    - ``init=None``: ``step(q, kv, None) -> (o, lse)`` is one chunk's partial and the
      partials merge by log-sum-exp (:func:`merge_partials`);
    - ``init=(o0, lse0)`` (the empty state: zeros, -inf): ``step(q, kv, prev)`` continues the
      online softmax from ``prev`` itself (the flash kernel). Every merge then runs inside the
      kernel on its ``[block_q, K]`` tiles, so the result does not depend on the layout the
      caller keeps ``o`` in — this is what makes the Ulysses ``out_a2a`` modes bit-identical
      for any number of ring steps.
    """
    if init is not None:
        o, lse = step(q, kv, init)
    else:
        o, lse = step(q, kv, None)
        o = o.astype(jnp.float32)
    if size == 1:
        return o, lse

    def body(carry, _):
        o, lse, kv = carry
        kv = col.ring_shift(kv, axis, size)
        if init is not None:
            o, lse = step(q, kv, (o, lse))
        else:
            o2, lse2 = step(q, kv, None)
            o, lse = merge_partials(o, lse, o2.astype(jnp.float32), lse2)
        return (o, lse, kv), None

    (o, lse, _), _ = jax.lax.scan(body, (o, lse, kv), None, length=size - 1)
    return o, lse


def _empty_state(o_shape, lse_shape):
    """The online-softmax state before any key: output zeros, log-sum-exp -inf (float32)."""
    return jnp.zeros(o_shape, jnp.float32), jnp.full(lse_shape, -jnp.inf, jnp.float32)


# ------------------------------------------------------------------ plan + engine


def _mesh_view(mesh: Mesh, R: int, U: int):
    """The mesh and axis names the engine runs on."""
    if R > 1 and U > 1:
        d = mesh.devices
        view = Mesh(d.reshape(d.shape[0], d.shape[1], R, U, d.shape[3]),
                    ("data", "fsdp", "context_ring", "context_ulysses", "tensor"))
        return view, ("context_ring", "context_ulysses"), "context_ring", "context_ulysses"
    return mesh, "context", ("context" if R > 1 else None), ("context" if U > 1 else None)


def shard_major_reasons(local: str, head_dim: int, block_q: int, block_kv: int, dtype):
    """Unmet preconditions of the shard-major kernel path (each names the value and the fix)."""
    from ditax.attention.flash import check_shard_major_supported

    reasons = []
    if local != "flash":
        reasons.append(f"local={local!r}: the shard-major path needs local='flash' (the kernel "
                       f"that reads q and writes its output shard-major); set local='flash' or "
                       f"use out_a2a='chunked'/'flat'")
    return reasons + check_shard_major_supported(head_dim, block_q, block_kv, dtype)


def check_heads(backend: str, mesh, num_heads: int, U: int, R: int) -> None:
    T = mesh.shape.get("tensor", 1)
    if num_heads % T:
        raise ValueError(f"{backend}: {num_heads} heads are not divisible by mesh.tensor={T}; "
                         f"choose a tensor size dividing {num_heads}")
    if (num_heads // T) % U:
        raise ValueError(
            f"{backend}: {num_heads // T} heads per tensor shard are not divisible by the {U} "
            f"Ulysses shards; use backend='ulysses_ring' with ulysses_shards dividing "
            f"{num_heads // T}, backend='ring', or a mesh with a different context size")


def sequence_parallel_attention(q, k, v, *, mesh, kv_mask, scale, ring: int, ulysses: int,
                                local: str, out_a2a: str, block_q: int, block_kv: int,
                                interpret, backend: str):
    """Self-attention on the ``ring × ulysses`` grid (see module docstring).

    q/k/v ``[B, L, N, K]`` (global; sequence sharded over ``context``), kv_mask ``[B, L]``.
    Returns ``[B, L, N, K]`` in q's dtype, sharded like q.
    """
    from ditax.attention.flash import effective_block

    check_out_a2a(out_a2a)
    R, U = ring, ulysses
    C = R * U
    B, L, N, K = q.shape
    check_heads(backend, mesh, N, U, R)
    nb = mesh.shape["data"] * mesh.shape["fsdp"]
    if B % nb:
        raise ValueError(f"{backend}: batch {B} is not divisible by data×fsdp = {nb}; use a "
                         f"batch that is a multiple of {nb} or a smaller data/fsdp mesh")

    # Padding plan: shard length Lc; on flash, the effective blocks and Lc a block multiple,
    # identical for every out_a2a mode so the modes compute bit-identical values.
    Lc = -(-L // C)
    bq = bkv = None
    if local == "flash":
        bq, bkv = effective_block(block_q, Lc), effective_block(block_kv, Lc)
        Lc = _round_up(Lc, math.lcm(bq, bkv))
    L_pad = C * Lc

    kernel_path = False
    if out_a2a != "flat" and U > 1:
        reasons = shard_major_reasons(local, K, bq or block_q, bkv or block_kv, q.dtype)
        if out_a2a == "shard_major" and reasons:
            raise ValueError(f"{backend}: out_a2a='shard_major' cannot run: " + "; ".join(reasons))
        kernel_path = not reasons
        if out_a2a == "chunked":
            _log_once(("chunked", kernel_path, local),
                      "%s out_a2a=chunked: %s", backend,
                      "shard-major flash kernel path" if kernel_path
                      else f"chunked exchange around local={local} ({reasons[0]})")
    elif out_a2a == "shard_major" and U == 1:
        kernel_path = not shard_major_reasons(local, K, bq or block_q, bkv or block_kv, q.dtype)
        if not kernel_path:
            raise ValueError(f"{backend}: out_a2a='shard_major' cannot run: " + "; ".join(
                shard_major_reasons(local, K, bq or block_q, bkv or block_kv, q.dtype)))

    mask = kv_mask
    if L_pad != L:
        pad = ((0, 0), (0, L_pad - L), (0, 0), (0, 0))
        q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
        mask = jnp.ones((B, L), bool) if mask is None else mask
        mask = jnp.pad(mask, ((0, 0), (0, L_pad - L)))
    has_mask = mask is not None

    run_mesh, seq_axes, ring_axis, uly_axis = _mesh_view(mesh, R, U)
    heads_axis = "tensor" if mesh.shape.get("tensor", 1) > 1 else None
    x_spec = P(BATCH_AXES, seq_axes, heads_axis, None)
    m_spec = P(BATCH_AXES, seq_axes)
    lk = local_kernel(local, need_lse=R > 1, block_q=bq or block_q, block_kv=bkv or block_kv,
                      interpret=interpret)

    def body(q, k, v, *maybe_mask):
        m = maybe_mask[0] if maybe_mask else None
        if kernel_path:
            return _body_kernel_path(q, k, v, m, scale, R, U, ring_axis, uly_axis, bq, bkv,
                                     interpret)
        if U > 1:
            to_heads = (col.seq_to_heads_flat if out_a2a == "flat"
                        else functools.partial(col.seq_to_heads_chunked, num_shards=U))
            q, k, v = (to_heads(x, uly_axis) for x in (q, k, v))
            if m is not None:
                m = col.gather_keep(m, uly_axis).reshape(m.shape[0], -1)
        if R == 1:
            o = lk(q, k, v, m, scale)
        elif lk.carries:                                    # flash: merge inside the kernel
            def step(q, kv, prev):
                return lk(q, kv[0], kv[1], kv[2], scale, prev)   # lse [b, h, Lq] as carried
            init = _empty_state(q.shape, (q.shape[0], q.shape[2], q.shape[1]))
            o, _ = ring_loop(step, q, (k, v, m), ring_axis, R, init=init)
        else:
            def step(q, kv, _):
                o, lse = lk(q, kv[0], kv[1], kv[2], scale)
                return o, jnp.swapaxes(lse, 1, 2)           # lse [b, h, Lq] -> [b, Lq, h]
            o, _ = ring_loop(step, q, (k, v, m), ring_axis, R)
        o = o.astype(q.dtype)
        if U > 1:
            o = (col.heads_to_seq_flat(o, uly_axis) if out_a2a == "flat"
                 else col.heads_to_seq_chunked(o, uly_axis, U))
        return o

    args = (q, k, v) + ((mask,) if has_mask else ())
    specs = (x_spec,) * 3 + ((m_spec,) if has_mask else ())
    out = jax.shard_map(body, mesh=run_mesh, in_specs=specs, out_specs=x_spec,
                        check_vma=False)(*args)
    return out[:, :L] if L_pad != L else out


def _body_kernel_path(q, k, v, m, scale, R, U, ring_axis, uly_axis, bq, bkv, interpret):
    """Shard-major path: q/k/v enter the flash kernel as ``[U, b, h, Lc, K]`` and its output
    leaves through one leading-axis all_to_all."""
    from ditax.attention.flash import flash_attention_shard_major

    if U > 1:
        q5, k5, v5 = (col.seq_to_shard_major(x, uly_axis, U) for x in (q, k, v))
        keep = None if m is None else col.gather_keep(m, uly_axis)      # [b, U, Lc]
    else:
        q5, k5, v5 = (jnp.transpose(x, (0, 2, 1, 3))[None] for x in (q, k, v))
        keep = None if m is None else m[:, None, :]
    fl = functools.partial(flash_attention_shard_major, scale=scale, block_q=bq, block_kv=bkv,
                           interpret=interpret)
    if R == 1:
        o5 = fl(q5, k5, v5, kv_keep=keep)
    else:
        def step(q5, kv, prev):                 # the kernel continues from prev (its layout)
            return fl(q5, kv[0], kv[1], kv_keep=kv[2], return_lse=True, o_prev=prev[0],
                      lse_prev=prev[1])
        init = _empty_state(q5.shape, q5.shape[:-1])
        o5, _ = ring_loop(step, q5, (k5, v5, keep), ring_axis, R, init=init)
    o5 = o5.astype(q.dtype)
    if U > 1:
        return col.shard_major_to_seq(o5, uly_axis)
    return jnp.transpose(o5[0], (0, 2, 1, 3))


def cross_attention_sharded(q, k, v, *, mesh, kv_mask=None, scale=None, local: str = "xla",
                            block_q: int = 128, block_kv: int = 128, interpret=None):
    """Cross-attention under context parallelism: queries stay sequence-sharded over
    ``context``, text K/V (``Lk`` tokens, usually ``Lk != Lq``) are replicated over
    ``context``; no exchange at all. Batch over ``(data, fsdp)``, heads over ``tensor``.

    q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` → ``[B, Lq, N, K]``.
    Lq that does not divide the context size is padded (padded query rows dropped).

    Why a helper: a jnp local kernel (``xla``, ``reference``, ``blockwise``) called under
    ``jit`` on these shardings is partitioned by XLA the same way with no communication, so
    the transformer may call ``attend(q, k, v, backend="xla")`` directly; a Pallas kernel
    (``flash``, ``splash``) is opaque to the partitioner and needs this ``shard_map``.
    """
    from ditax.attention import sharded_local_attention

    context_size(mesh)
    check_heads("cross attention", mesh, q.shape[2], 1, 1)
    run = local_kernel(local, need_lse=False, block_q=block_q, block_kv=block_kv,
                       interpret=interpret)

    def fn(q, k, v, *, kv_mask=None, scale=None):
        return run(q, k, v, kv_mask, scale)

    return sharded_local_attention(fn, q, k, v, mesh=mesh, kv_mask=kv_mask, scale=scale)
