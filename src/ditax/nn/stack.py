"""Stacks of identical blocks: built once with a leading layer axis, run scanned or unrolled,
each block under a remat policy — the mechanism every family's transformer uses.

A stack is one module whose parameters carry a leading ``layers`` axis (``nnx.vmap`` over
split RNGs), so compile time stays flat in depth when it runs under ``nnx.scan``. A
sub-range of the stack (a sampler's step cache runs the first block alone) scans over layer
indices and reads each layer's weights in place, without a sliced copy of the stack.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.nn.offload import is_host, scan_prefetched, to_device

# remat policy name (a model config's ``remat``; "none" = no remat) -> jax policy
REMAT = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_saveable,
    "save_dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_attn_out": jax.checkpoint_policies.save_only_these_names("attn_out"),
    # the projections a family names: "proj_out" (output projections: the most FLOPs per
    # saved byte) and "proj_in" (input projections it chooses to keep); the rest (attention
    # kernels, elementwise work, unnamed dots) runs again in the backward. Flux names every
    # block's output projections and its double blocks' q/k/v and MLP inputs; Wan none.
    "save_proj": jax.checkpoint_policies.save_only_these_names("proj_out", "proj_in"),
    # the output projections alone: a family's "proj_in" runs again too (FLUX.1-dev's 1024²
    # step on v5p-8: 8.2 GiB fewer temporaries a chip than save_proj, 4% more dot FLOPs)
    "save_proj_out": jax.checkpoint_policies.save_only_these_names("proj_out"),
}


def make_stack(make_block: Callable[[nnx.Rngs], nnx.Module], depth: int,
               rngs: nnx.Rngs) -> nnx.Module:
    """``depth`` blocks ``make_block(rngs)`` as one module with a leading layer axis.

    Block ``i`` draws from the ``i``-th of ``depth`` split keys, one block at a time under a
    scan (the values an ``nnx.vmap`` over the split keys draws, bit for bit): an XLA program
    drawing a stack then holds one block's random draw, compiled once for every layer (a
    TPU's compile time grows with the elements one fusion draws: Wan 2.1 1.3B's 30 vmapped
    blocks took over a minute to compile for a v5e, ``benchmarks/init_speed.py``)."""
    @nnx.split_rngs(splits=depth)
    @nnx.scan(in_axes=(0,), out_axes=0)
    def make(rngs):
        return make_block(rngs)

    return make(rngs)


def run_stack(blocks: nnx.Module, body: Callable[[Any, nnx.Module], Any], carry, *,
              depth: int, start: int = 0, stop: int | None = None, remat: str = "none",
              scan: bool = True, prefetch: int = 0, what: str = "blocks"):
    """``carry = body(carry, block)`` for blocks ``start .. stop-1`` (default all) of the
    stack ``blocks`` (``depth`` layers); ``carry`` any pytree of arrays.

    ``remat``: a :data:`REMAT` policy name, or ``"none"``; ``scan``: run under a scan (the
    whole stack: ``nnx.scan`` over the stacked module; a sub-range: ``lax.scan`` over layer
    indices) instead of unrolled Python. ``what`` names the stack in the range error.

    Weights in host memory (``model.offload=host``, :mod:`ditax.nn.offload`): each block's are
    put in device memory for it. ``prefetch`` k > 0: a scan carries the next k blocks' device
    copies, block ``i + k``'s copy issued before block ``i`` runs (:func:`~ditax.nn.offload.
    scan_prefetched`; for programs without a backward pass: the carried copies would be kept
    for it); 0: each block's copy inside its own step (under remat a backward copies again).
    """
    stop = depth if stop is None else stop
    if not 0 <= start <= stop <= depth:
        raise ValueError(f"{what} {start}..{stop} outside 0..{depth}")
    if start == stop:
        return carry
    offloaded = any(is_host(x) for x in jax.tree.leaves(nnx.state(blocks)))
    if offloaded:
        inner = body
        body = lambda c, block: inner(c, to_device(block))   # noqa: E731  (no-op if there)
    if remat != "none":
        body = nnx.remat(body, policy=REMAT[remat], prevent_cse=not scan)

    # host weights scan over layer indices (below): nnx.scan would also return the stack's
    # state, a host array the program must not hand back
    if scan and (start, stop) == (0, depth) and not offloaded:
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(c, block):
            return body(c, block)

        return run(carry, blocks)
    gdef, stacked = nnx.split(blocks)
    if scan and offloaded and prefetch > 0:
        return scan_prefetched(lambda c, layer: body(c, nnx.merge(gdef, layer)), stacked,
                               carry, start, stop, prefetch)
    if scan:
        def step(c, i):
            layer = jax.tree.map(lambda p: jax.lax.dynamic_index_in_dim(p, i, 0, False),
                                 stacked)
            return body(c, nnx.merge(gdef, layer)), None

        return jax.lax.scan(step, carry, jnp.arange(start, stop))[0]
    for i in range(start, stop):
        carry = body(carry, nnx.merge(gdef, jax.tree.map(lambda p, i=i: p[i], stacked)))
    return carry


__all__ = ["REMAT", "make_stack", "run_stack"]
