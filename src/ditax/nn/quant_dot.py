"""The arithmetic of 8-bit :class:`ditax.nn.Linear` layers (:mod:`ditax.nn.quant` sets them up
and loads them): per-channel scales, rounding, and the dots.

The dot (:meth:`QuantSpec.einsum`): weights only — ``(x @ q) * s`` in the compute dtype (the
8-bit kernel converted inside the dot's fusion; a per-output-channel scale commutes with the
contraction). With activations — ``x`` quantized per token (the scale ``max|x| / qmax`` over
the contracted axes), then ``int8 x int8 -> int32`` (``preferred_element_type``; XLA runs
integer dots on every backend) or ``fp8 x fp8 -> float32`` where the platform has fp8 dots
(:func:`~ditax.nn.quant_target.native_dots`; elsewhere the fp8 values are widened to the
compute dtype first: the same numbers, no speed-up; on a TPU without fp8 matrix units the
mode is refused, :func:`~ditax.nn.quant_target.check_dots`), and both scales applied to the
result.

Inputs made of parts (a layer on a concatenation: FLUX's single blocks join the attention
output and the MLP) are quantized part by part with one shared per-token scale
(:meth:`QuantSpec.quantize_parts`): the same numbers as quantizing the concatenation.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

MODES = ("none", "int8", "fp8")
QMAX = {"int8": 127.0, "fp8": 448.0}
STORED = {"int8": jnp.dtype(jnp.int8), "fp8": jnp.dtype(jnp.float8_e4m3fn)}


# --- the numbers --------------------------------------------------------------------------

def channel_scale(w, mode: str, axis: int = -2):
    """Per-output-channel scale ``max|w| / qmax`` over the input ``axis`` (numpy or jax;
    float32; 1 where a channel is all zeros). On jax arrays ``max |w|`` is taken in w's dtype
    (exact), so XLA reads w itself (from a float32 cast it wrote a float32 copy)."""
    xp = jnp if isinstance(w, jax.Array) else np
    amax = (jnp.max(jnp.abs(w), axis=axis).astype(jnp.float32) if xp is jnp
            else np.max(np.abs(w.astype(np.float32)), axis=axis))
    return amax_scale(amax, mode, xp)


def amax_scale(amax, mode: str, xp=jnp):
    """The 8-bit scale of a float32 ``max |x|``: ``amax / qmax``, 1 where it is 0."""
    return xp.where(amax > 0, amax / QMAX[mode], 1.0).astype(xp.float32)


def quantize_values(w, scale, mode: str):
    """``w / scale`` (scale already broadcastable) in the 8-bit storage dtype of ``mode``."""
    xp = jnp if isinstance(w, jax.Array) else np
    v = w.astype(xp.float32) / scale
    if mode == "int8":
        return xp.clip(xp.round(v), -127, 127).astype(STORED[mode])
    return xp.clip(v, -448.0, 448.0).astype(STORED[mode])


def dequantize(q, scale, dtype):
    """The kernel ``q * scale`` in ``dtype`` (``scale``: the kernel without its input axis)."""
    return (q.astype(jnp.float32) * jnp.expand_dims(scale, -2)).astype(dtype)


def _place(letters: str, out: str, x):
    """``x`` (axes named ``letters``) transposed and expanded to broadcast against ``out``."""
    order = sorted(range(len(letters)), key=lambda i: out.index(letters[i]))
    x = jnp.transpose(x, order)
    shape = list(x.shape)
    have = [letters[i] for i in order]
    full = [shape[have.index(c)] if c in have else 1 for c in out]
    return x.reshape(full)


def _letters(spec: str, x_ndim: int) -> tuple[str, str, str]:
    lhs, rest = spec.split(",")
    rhs, out = rest.split("->")
    if "..." in lhs:
        free = [c for c in "ABCDEFGHIJ" if c not in spec][:x_ndim - len(lhs) + 3]
        lhs, out = lhs.replace("...", "".join(free)), out.replace("...", "".join(free))
    return lhs, rhs, out



def join_parts(parts, lead: int | None = None):
    """``parts`` flattened after their ``lead`` token axes (default all but the last) and
    concatenated on the last axis: the one input a layer on a concatenation reads."""
    lead = parts[0].ndim - 1 if lead is None else lead
    return jnp.concatenate([p.reshape(p.shape[:lead] + (-1,)) for p in parts], -1)

class QuantizedInput(NamedTuple):
    """An activation quantized per token (:meth:`QuantSpec.quantize_input`): 8-bit ``values``
    (x's shape), float32 ``scale`` (x's shape without the contracted axes)."""
    values: jax.Array
    scale: jax.Array


class QuantizedParts(NamedTuple):
    """The parts of a joined activation quantized per token with one shared scale
    (:meth:`QuantSpec.quantize_parts`, int8): 8-bit ``values`` (each part's own shape: the
    token axes, then its contracted ones), float32 ``scale`` (the token axes)."""
    values: tuple
    scale: jax.Array


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """How one :class:`~ditax.nn.Linear` computes: ``mode`` (int8 | fp8), ``activations``
    (quantize ``x`` per token too), ``native`` (emit the fp8 x fp8 dot; int8 x int8 is
    emitted everywhere)."""

    mode: str
    activations: bool = False
    native: bool = False

    def quantize_input(self, x, contracted: int = 1):
        """``x`` quantized per token over its last ``contracted`` axes once, for several dots
        (a layer's column chunks; :meth:`einsum` takes it as ``x``); without activations x."""
        if not self.activations:
            return x
        return self._per_token(x, tuple(range(x.ndim - contracted, x.ndim)))

    def _per_token(self, x, axes) -> "QuantizedInput":
        """``x`` in 8 bits with one scale per token (the max over the contracted ``axes``)."""
        sx = channel_scale(x, self.mode, axis=axes)
        return QuantizedInput(quantize_values(x, jnp.expand_dims(sx, axes), self.mode), sx)

    def quantize_parts(self, parts, lead: int | None = None):
        """``concatenate([p.reshape(p.shape[:lead] + (-1,)) for p in parts], -1)`` (parts of
        one dtype; ``lead``: the token axes, default all but the last) as
        :meth:`quantize_input` would quantize it, made part by part: the per-token max is the
        max of the parts' maxima (exact) and each part is rounded with the shared scale in
        its own shape. int8: kept as parts (:class:`QuantizedParts`; :meth:`einsum` sums
        their int32 products, exactly the joined product); fp8: the 8-bit parts joined.
        The same values, without a wide float concatenation read twice nor a relayout of a
        head-major part: on a v5e XLA made the concatenation's max and its rounding two
        passes that each re-read (or recomputed) both parts, and relaid the head-major part
        out (FLUX.2's single block: its attention output and SwiGLU into ``to_out``;
        ``benchmarks/quant_fusions.py``). Without activations the concatenation."""
        if not self.activations:
            return join_parts(parts, lead)
        lead = parts[0].ndim - 1 if lead is None else lead
        amax = None
        for p in parts:
            m = jnp.max(jnp.abs(p), axis=tuple(range(lead, p.ndim)))
            amax = m if amax is None else jnp.maximum(amax, m)
        sx = amax_scale(amax.astype(jnp.float32), self.mode)
        values = tuple(quantize_values(p, sx.reshape(sx.shape + (1,) * (p.ndim - lead)),
                                       self.mode) for p in parts)
        if self.mode == "int8":
            return QuantizedParts(values, sx)
        return QuantizedInput(join_parts(values, lead), sx)

    def _parts_dot(self, spec: str, x: "QuantizedParts", q, scale, dtype):
        """``x``'s joined input through ``q [in, out]`` (``spec`` ``...i,io->...o`` only):
        one int32 product per part against its rows of ``q``, summed (integers: exactly
        the joined product), then both scales as :meth:`einsum` applies them."""
        if spec != "...i,io->...o":
            raise ValueError(f"QuantSpec.einsum: parts of an input take spec '...i,io->...o', "
                             f"not {spec!r}")
        lead, y, start = x.scale.ndim, None, 0
        for v in x.values:
            rest = v.shape[lead:]
            size = int(np.prod(rest))
            w = jax.lax.slice_in_dim(q, start, start + size, axis=q.ndim - 2)
            w = w.reshape(w.shape[:-2] + rest + w.shape[-1:])
            c = "".join("pqrstuvw"[:len(rest)])
            part = jnp.einsum(f"...{c},{c}o->...o", v, w, preferred_element_type=jnp.int32)
            y = part if y is None else y + part
            start += size
        if start != q.shape[-2]:
            raise ValueError(f"QuantSpec.einsum: the parts hold {start} inputs, the kernel "
                             f"{q.shape[-2]}")
        sw = scale.reshape((1,) * (y.ndim - 1) + (q.shape[-1],))
        return (y.astype(jnp.float32) * x.scale[..., None] * sw).astype(dtype)

    def einsum(self, spec: str, x, q, scale, dtype):
        """``einsum(spec, x, q * scale)`` in ``dtype``; ``q`` the 8-bit kernel viewed as the
        spec's right operand, ``scale`` its per-output-channel scales (any shape with the
        operand's output axes' size); ``x`` may be :meth:`quantize_input`'s result (its
        contracted axes the spec's, last)."""
        if isinstance(x, QuantizedParts):
            return self._parts_dot(spec, x, q, scale, dtype)
        pre = x if isinstance(x, QuantizedInput) else None
        lhs, rhs, out = _letters(spec, (x if pre is None else pre.values).ndim)
        spec = f"{lhs},{rhs}->{out}"
        w_out = "".join(c for c in rhs if c in out)
        sw = _place(w_out, out, scale.reshape([q.shape[rhs.index(c)] for c in w_out]))
        if not self.activations:
            y = jnp.einsum(spec, x.astype(dtype), q.astype(dtype))
            return (y * sw.astype(dtype)).astype(dtype)
        contracted = tuple(i for i, c in enumerate(lhs) if c not in out)
        xq, sx = self._per_token(x, contracted) if pre is None else pre
        if self.mode == "int8":
            y = jnp.einsum(spec, xq, q, preferred_element_type=jnp.int32)
        elif self.native:
            y = jnp.einsum(spec, xq, q, preferred_element_type=jnp.float32)
        else:
            y = jnp.einsum(spec, xq.astype(dtype), q.astype(dtype),
                           preferred_element_type=jnp.float32)
        x_out = "".join(c for c in lhs if c in out)
        y = y.astype(jnp.float32) * _place(x_out, out, sx) * sw
        return y.astype(dtype)


__all__ = ["MODES", "QMAX", "STORED", "QuantSpec", "QuantizedInput", "QuantizedParts",
           "amax_scale", "channel_scale", "join_parts", "quantize_values", "dequantize"]
