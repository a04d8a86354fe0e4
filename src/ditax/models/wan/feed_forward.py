"""Wan's feed-forward (diffusers ``FeedForward``, gelu-approximate) and its column-chunked
``proj_in`` on TPU: the blocks' MLP, apart from the transformer that stacks them
(:mod:`ditax.models.wan.transformer`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.nn import Linear
from ditax.parallel.platform import platform_of
from ditax.parallel.rules import param_spec
from ditax.parallel.sharding import ShardingContext


class FeedForward(nnx.Module):
    """``net.0.proj → GELU(tanh) → net.2`` (diffusers ``FeedForward``, gelu-approximate).

    On TPU, with ``proj_in``'s kernel split over its input dim (fsdp / context) and not over
    its columns (no tensor axis), ``proj_in`` runs in :data:`TPU_COLUMN_CHUNKS` column chunks,
    one after another in a loop: each chunk's kernel slice is gathered whole, one dot, GELU,
    written into its columns of the hidden. Unchunked, XLA gathers that kernel by a windowed
    dot over its input dim whose partial product and accumulator are each the size of the
    output, and the GELU writes a third: 3 × ``[L, ffn_dim]`` set the forward's peak memory
    (14B 720p context8 on v6e: 3 × 249 MiB; ``docs/architecture.md``, "TPU relayout
    copies"). Same values (each column is one dot over the whole input, GELU is elementwise).
    """

    def __init__(self, dim, ffn_dim, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.proj_in = Linear(dim, ffn_dim, **kw)     # diffusers: ffn.net.0.proj
        self.proj_out = Linear(ffn_dim, dim, **kw)    # diffusers: ffn.net.2

    def __call__(self, x, sharding: ShardingContext, chunks: int | None = None):
        """x ``[B, L, D]`` → ``[B, L, D]``; ``chunks`` (None: :func:`ffn_chunks`) column chunks
        of ``proj_in``."""
        _, din, width = self.proj_in.dims()
        chunks = ffn_chunks(sharding, din, width) if chunks is None else chunks
        if chunks == 1:
            h = jax.nn.gelu(self.proj_in(x), approximate=True)
        else:
            # each chunk's kernel slice gathered whole before its dot (the barrier keeps XLA
            # from hoisting one gather of the whole kernel out of the loop)
            gather = lambda w: sharding.constrain(jax.lax.optimization_barrier(w),  # noqa: E731
                                                  (None, None))
            h = gelu_columns(self.proj_in, x, chunks, gather)
        h = sharding.constrain(h, ("act_batch", "act_seq", "act_mlp"))
        return self.proj_out(h)


def gelu_columns(lin: Linear, x, chunks: int, place):
    """``gelu(lin(x))`` computed in ``chunks`` column chunks in a loop (``place`` maps each
    ``[in, width / chunks]`` kernel slice before its dot), written into one ``[..., width]``
    hidden. The gradient is the one-dot formula's (:func:`_gelu_dense`; the loop's own
    backward stacks every iteration's residuals: +1.2 GiB on the 14B 720p training step)."""
    width, lead = lin.dims()[2], x.shape[:-1]
    m = width // chunks

    def loop(x, w, b):
        def body(c, h):
            part = lin.out_columns(x, c * m, m, place) if w is None else (
                jnp.einsum("...i,io->...o", x, place(jax.lax.dynamic_slice_in_dim(
                    w, c * m, m, axis=w.ndim - 1))) + jax.lax.dynamic_slice_in_dim(b, c * m, m))
            part = jax.nn.gelu(part, approximate=True)
            return jax.lax.dynamic_update_slice_in_dim(h, part, c * m, axis=h.ndim - 1)

        return jax.lax.fori_loop(0, chunks, body, jnp.zeros(lead + (width,), lin.dtype))

    if lin.quant is not None or type(lin).out_columns is not Linear.out_columns:
        # 8-bit kernels (inference only) and layers with terms of their own (unmerged LoRA)
        # go through the layer's out_columns, differentiated through the loop; 8-bit
        # activations quantized once, before the loop (in it, XLA re-quantized the
        # loop-invariant bf16 input in every chunk)
        return loop(lin.column_input(x), None, None)
    dense = jax.custom_vjp(lambda x, w, b: loop(x, w, b))
    dense.defvjp(lambda x, w, b: (loop(x, w, b), (x, w, b)),
                 lambda res, g: jax.vjp(_gelu_dense, *res)[1](g))
    b = lin.bias[...] if lin.bias is not None else jnp.zeros((width,), lin.dtype)
    return dense(x.astype(lin.dtype), lin.kernel[...].astype(lin.dtype), b.astype(lin.dtype))


def _gelu_dense(x, w, b):
    return jax.nn.gelu(jnp.einsum("...i,io->...o", x, w) + b, approximate=True)


#: proj_in column chunks on TPU (see FeedForward): the hidden plus one ``[L, ffn_dim / 4]``
#: chunk and its ``[D, ffn_dim / 4]`` kernel slice live at a time.
TPU_COLUMN_CHUNKS = 4


def ffn_chunks(sharding: ShardingContext, din: int, width: int) -> int:
    """:data:`TPU_COLUMN_CHUNKS` where the chunked ``proj_in`` pays (TPU, kernel ``[din,
    width]`` split over its input dim only, columns in whole 128-lane tiles per chunk), else 1."""
    mesh = sharding.mesh
    c = TPU_COLUMN_CHUNKS
    if mesh is None or platform_of(mesh).name != "tpu" or width % (128 * c):
        return 1
    spec_in, spec_out = param_spec(("embed", "mlp"), mesh, (din, width))
    return c if spec_in is not None and spec_out is None else 1


__all__ = ["FeedForward", "TPU_COLUMN_CHUNKS", "ffn_chunks", "gelu_columns"]
