"""Dense layer with the storage / compute dtype split every model here uses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.nn.quant_dot import join_parts


class Linear(nnx.Module):
    """``y = x @ kernel + bias``; kernel ``[in, out]`` (torch ``weight.T``), compute in ``dtype``.

    ``param_dtype`` is the storage dtype of ``kernel`` / ``bias`` (LeCun-normal / zero init);
    both are cast to ``dtype`` for the matmul.

    ``out_heads=N`` stores the kernel head-major ``[N, in, K]`` (out = N·K, bias still
    ``[out]``): the layout :meth:`to_head_major`'s dot reads. On TPU an ``[in, N·K]`` kernel
    (sharded over ``in``) is relaid out to ``[N, in, K]`` for that dot in every layer
    (measured at Wan 14B 720p on v6e: 6.25 MiB per kernel shard, held as temporaries; see
    ``docs/architecture.md``, "TPU relayout copies"). Same values as the ``[in, out]`` kernel
    (init drawn ``[in, out]`` and moved); :meth:`matrix` is the ``[in, out]`` view.

    ``quant`` (None: full precision): a :class:`ditax.nn.quant.QuantSpec` set on a loaded
    model, with an 8-bit ``kernel`` and its float32 ``kernel_scale`` (every dot goes
    through :meth:`_dot`).
    """

    quant = None

    def __init__(self, din: int, dout: int, *, dtype, param_dtype, rngs: nnx.Rngs, bias=True,
                 out_heads: int | None = None):
        pd = jnp.dtype(param_dtype)
        w = nnx.initializers.lecun_normal()(rngs.params(), (din, dout), pd)
        if out_heads:
            w = jnp.swapaxes(w.reshape(din, out_heads, dout // out_heads), 0, 1)
        self.kernel = nnx.Param(w)
        self.bias = nnx.Param(jnp.zeros((dout,), pd)) if bias else None
        self.dtype = jnp.dtype(dtype)
        self.out_heads = out_heads

    def dims(self) -> tuple[tuple[int, ...], int, int]:
        """(leading axes of the kernel, e.g. a scanned stack's ``(L,)``; in; out)."""
        s = self.kernel[...].shape
        if self.out_heads:
            return tuple(s[:-3]), s[-2], s[-3] * s[-1]
        return tuple(s[:-2]), s[-2], s[-1]

    def matrix(self):
        """The kernel as ``[in, out]`` in ``dtype`` (a relayout for ``out_heads`` kernels)."""
        w = self.kernel[...]
        if self.quant is not None:   # 8-bit kernel x its per-output-channel scale
            w = w.astype(jnp.float32) * jnp.expand_dims(self.kernel_scale[...], -2)
        return self._as_matrix(w.astype(self.dtype))

    def _as_matrix(self, w):
        if self.out_heads:
            w = jnp.swapaxes(w, -3, -2).reshape(w.shape[:-3] + (w.shape[-2], -1))
        return w

    def _dot(self, spec, x, view):
        """``einsum(spec, x, view(kernel))`` in ``dtype``; ``view`` reshapes the stored
        kernel into the spec's right operand (8-bit kernels: the quantized dot)."""
        if self.quant is not None:
            return self.quant.einsum(spec, x, view(self.kernel[...]), self.kernel_scale[...],
                                     self.dtype)
        return jnp.einsum(spec, x.astype(self.dtype), view(self.kernel[...].astype(self.dtype)))

    def __call__(self, x):
        y = self._dot("...i,io->...o", x, self._as_matrix)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y

    def out_columns(self, x, start, size: int, place=None):
        """Output columns ``[start, start + size)`` of the layer on ``x [..., in]`` (bias
        included): ``x @ kernel[:, start:start+size]``; ``start`` may be traced (a loop
        index), ``size`` static; ``place`` (optional) maps the kernel's ``[in, size]`` slice
        before the dot (e.g. a sharding constraint: where it is gathered). For an unheaded
        kernel only."""
        self._check_plain("out_columns")
        cut = lambda a: jax.lax.dynamic_slice_in_dim(a, start, size, axis=a.ndim - 1)  # noqa: E731
        place = place or (lambda w: w)
        if self.quant is not None:
            y = self.quant.einsum("...i,io->...o", x, place(cut(self.kernel[...])),
                                  cut(self.kernel_scale[...]), self.dtype)
        else:
            y = jnp.einsum("...i,io->...o", x.astype(self.dtype),
                           place(cut(self.kernel[...]).astype(self.dtype)))
        if self.bias is not None:
            y = y + cut(self.bias[...].astype(self.dtype))
        return y

    def column_input(self, x):
        """``x`` as :meth:`out_columns` reads it in every chunk of one layer: with 8-bit
        activations quantized once (:meth:`~ditax.nn.quant.QuantSpec.quantize_input`)."""
        return x if self.quant is None else self.quant.quantize_input(x)

    def joined_input(self, parts, lead: int | None = None):
        """The parts flattened after their ``lead`` token axes (default all but the last) and
        concatenated, as :meth:`__call__` reads it: with 8-bit activations quantized part by
        part, the same values as the concatenation's
        (:meth:`~ditax.nn.quant.QuantSpec.quantize_parts`)."""
        if self.quant is None:
            return join_parts(parts, lead)
        return self.quant.quantize_parts(parts, lead)

    def _check_plain(self, what):
        if self.out_heads:
            raise ValueError(f"Linear.{what}: the kernel is stored head-major")

    def from_heads(self, x):
        """The layer on ``x [..., N, K]`` flattened to ``[..., N·K]``, contracting ``(N, K)``
        directly: on TPU, where (8, 128) tiles cover the two minor dims, a reshape
        ``[L, N, K] → [L, N·K]`` is a relayout copy of the whole activation; splitting the
        kernel's input dim into ``(N, K)`` is free (it is the major dim)."""
        n, k = x.shape[-2:]
        y = self._dot("...nk,nko->...o", x, lambda w: self._as_matrix(w).reshape(n, k, -1))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y

    def to_head_major(self, x, num_heads: int):
        """The layer on ``x [B, L, in]`` written head-major ``[B, N, L, K]`` (out = N·K)
        straight from the dot (the TPU attention kernels' layout; no relayout after it). An
        ``out_heads`` kernel ``[N, in, K]`` is read as stored."""
        if self.out_heads:
            if self.out_heads != num_heads:
                raise ValueError(f"to_head_major: {num_heads} heads asked, the kernel has "
                                 f"{self.out_heads}")
            y = self._dot("bli,nik->bnlk", x, lambda w: w)
        else:
            y = self._dot("bli,ink->bnlk", x, lambda w: self._as_matrix(w).reshape(
                x.shape[-1], num_heads, -1))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype).reshape(num_heads, 1, -1)
        return y

    def from_head_major(self, x):
        """The layer on head-major ``x [B, N, L, K]`` (in = N·K) → ``[B, L, out]``,
        contracting ``(N, K)`` where the attention kernel wrote them."""
        n, k = x.shape[1], x.shape[3]
        y = self._dot("bnlk,nko->blo", x, lambda w: self._as_matrix(w).reshape(n, k, -1))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y
