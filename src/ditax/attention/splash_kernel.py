"""The JAX splash kernels ditax builds (:func:`kernel`: cached per static configuration, a
full mask or a block table's) and the matmul precision they are traced under
(:func:`kernel_precision`, :func:`pinned_precision`): shared by :mod:`ditax.attention.splash`
and its padded-keys paths (:mod:`.splash_duplicate`, :mod:`.splash_split`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def kernel_precision(dtype) -> str:
    """The matmul precision splash's kernels are traced under, whatever
    ``jax_default_matmul_precision`` says: jax's splash kernel passes no precision to its
    ``dot_general``s, so they would take the global one, and under "highest" Mosaic refuses
    bf16 operands ("Bad lhs type", libtpu 0.0.42.1 / v6e). bf16 products are exact in the
    float32 accumulator, so "default" (one MXU pass) loses nothing for them; float32 inputs
    keep float32 accuracy ("highest"), as their dtype asks."""
    return "highest" if jnp.dtype(dtype) == jnp.float32 else "default"


def pinned_precision(fn, dtype):
    """``fn`` with its forward and backward traced under :func:`kernel_precision` (a
    ``custom_vjp`` whose rules enter the precision: the kernel's own backward is traced when
    the gradient is taken, outside any context around the forward call)."""
    precision = kernel_precision(dtype)

    @jax.custom_vjp
    def run(*args):
        with jax.default_matmul_precision(precision):
            return fn(*args)

    def fwd(*args):
        with jax.default_matmul_precision(precision):
            return jax.vjp(fn, *args)

    def bwd(vjp, g):
        with jax.default_matmul_precision(precision):
            return vjp(g)

    run.defvjp(fwd, bwd)
    return run


def forward_only(fn, why: str):
    """``fn`` with a VJP that raises :class:`~ditax.errors.AttentionUnavailable` ``why``: the
    kernel's residual-saving mode (``return_lse``) has none, and jax's own error ("Higher-order
    AD not supported") names neither the option nor the fix."""
    @jax.custom_vjp
    def run(*args):
        return fn(*args)

    def fwd(*args):
        return fn(*args), None

    def bwd(_, g):
        from ditax.errors import AttentionUnavailable

        raise AttentionUnavailable(why)

    run.defvjp(fwd, bwd)
    return run


def _table_mask(shape: tuple[int, int], table):
    """Splash's mask of a block table: read block by block as the kernel's preprocessing
    walks it (never a dense ``[L, L]`` array), hashed and compared by the table."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    class TableMask(sa.splash_attention_mask.Mask):
        @property
        def shape(self):
            return shape

        def __getitem__(self, idx):
            rows, cols = idx
            return table.tokens(rows, cols)

        def __eq__(self, other):
            return isinstance(other, TableMask) and (other.shape, other.table) == (
                shape, table)

        def __hash__(self):
            return hash(("TableMask", shape, table))

    mask = TableMask()
    mask.table = table
    return mask


@functools.lru_cache(maxsize=64)
def kernel(N: int, Lq: int, Lk: int, sizes, interpret: bool, save_residuals: bool,
            block_table=None):
    """Build (once per static configuration) a multi-head splash kernel: full-mask, or
    ``block_table``'s mask (the blocks it masks whole skipped).

    The mask preprocessing is numpy work at trace time; caching keeps retraces cheap.
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    one = (sa.FullMask((Lq, Lk)) if block_table is None
           else _table_mask((Lq, Lk), block_table))
    mask = sa.MultiHeadMask([one for _ in range(N)])
    # Concrete (not traced) mask-info arrays, so the cached kernel is valid in any trace.
    with jax.ensure_compile_time_eval():
        return sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                  interpret=interpret, save_residuals=save_residuals)
