"""A traced random init evaluated with its large draws in chunks: the same values, bit for bit,
in a program whose fusions each draw at most ``chunk`` elements.

A TPU compile's time grows with the elements one fusion writes (deviceless for a v5e: a
truncated normal of 1536 x 8960 compiles in ~1 s, of 4 x 1536 x 8960 in ~5-9 s). A draw
``jax.random.truncated_normal(key, (R, C))`` is threefry bits of the flat indices followed by
elementwise work, so its rows ``[i r, (i + 1) r)`` are that same work on the bits of those
indices. :func:`eval_chunked` evaluates a jaxpr (the random init's, traced once) as
``jax.core.eval_jaxpr`` would, except that a threefry ``random_bits`` of more than ``chunk``
elements and the elementwise equations that follow it are computed a block of consecutive
rows at a time under a ``lax.map`` (one compiled block, run ``R / r`` times), with the
counters jax's partitionable threefry uses (``jax_threefry_partitionable``, the default):
the flat index, split in two 32-bit words. Nested ``jit`` s are inlined, ``scan`` bodies
(stacked blocks, :func:`ditax.nn.stack.make_stack`) evaluated the same way; anything else is
bound as traced.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal
from jax.extend.random import threefry2x32_p

ELEMENTWISE = frozenset({
    "abs", "add", "and", "bitcast_convert_type", "ceil", "clamp", "convert_element_type",
    "copy", "div", "erf", "erf_inv", "exp", "floor", "integer_pow", "log", "logistic", "max",
    "min", "mul", "neg", "nextafter", "not", "or", "pow", "rem", "round", "rsqrt",
    "select_n", "shift_left", "shift_right_logical", "sign", "sqrt", "square", "stop_gradient",
    "sub", "tanh", "xor"})


class Lazy:
    """An array of ``shape`` computed one block of shape ``part`` at a time: ``fn(i)``
    (``i``: a uint32 scalar) is block ``i`` of the array's consecutive blocks (in row-major
    order: ``part`` is 1 on the axes before one axis and whole on those after it)."""

    def __init__(self, shape, part, fn):
        self.shape, self.part, self.fn = tuple(shape), tuple(part), fn

    def value(self):
        n = math.prod(self.shape) // math.prod(self.part)
        return lax.map(self.fn, jnp.arange(n, dtype=jnp.uint32)).reshape(self.shape)


def _part(shape, chunk: int) -> tuple:
    """The block one chunk of ``shape`` draws: on the first axis whose trailing axes hold at
    most ``chunk`` elements, the largest divisor of its length that keeps the block within
    ``chunk`` (the axes before it 1, those after it whole); None where that block would be
    under a sixteenth of ``chunk`` (a prime length: the loop would run too long)."""
    for j, n in enumerate(shape):
        row = math.prod(shape[j + 1:])
        if row <= chunk:
            r = max(r for r in range(1, n + 1) if n % r == 0 and r * row <= chunk)
            part = (1,) * j + (r,) + tuple(shape[j + 1:])
            return part if math.prod(part) * 16 >= chunk else None   # else: too many blocks


def _bits(key, params, chunk: int):
    """``random_bits(key)`` as a :class:`Lazy` (None where it is not chunked: small, not a
    single threefry key, or not the partitionable counters)."""
    shape, width = tuple(params["shape"]), params["bit_width"]
    size = math.prod(shape)
    if (size <= chunk or size >= 2 ** 32 or getattr(key, "shape", None) != ()
            or not jax.config.jax_threefry_partitionable
            or str(jax.random.key_impl(key)) != "threefry2x32"):
        return None
    part = _part(shape, chunk)
    if part is None:
        return None
    k1, k2 = jax.random.key_data(key)
    n = math.prod(part)

    def fn(i):
        lo = (lax.iota(jnp.uint32, n) + i * np.uint32(n)).reshape(part)
        b1, b2 = threefry2x32_p.bind(k1, k2, jnp.zeros(part, jnp.uint32), lo)
        if width == 64:
            return (b1.astype(jnp.uint64) << np.uint64(32)) | b2.astype(jnp.uint64)
        return (b1 ^ b2).astype(f"uint{width}")

    return Lazy(shape, part, fn)


def _elementwise(eqn, args):
    """An elementwise equation on a :class:`Lazy` as one (None where an operand or the result
    is not of its shape, or an operand is another array of that shape)."""
    lazy = next(a for a in args if isinstance(a, Lazy))
    out = eqn.outvars[0].aval.shape
    if len(eqn.outvars) != 1 or tuple(out) != lazy.shape:
        return None
    for a in args:
        if isinstance(a, Lazy):
            if (a.shape, a.part) != (lazy.shape, lazy.part):
                return None
        elif math.prod(np.shape(a)) != 1:
            return None

    def fn(i):
        return eqn.primitive.bind(*[a.fn(i) if isinstance(a, Lazy) else a for a in args],
                                  **eqn.params)

    return Lazy(lazy.shape, lazy.part, fn)


def _inline(eqn) -> bool:
    """A nested ``jit`` that places nothing (jax.random's own): evaluated in line."""
    return eqn.primitive.name in ("jit", "pjit") and all(
        type(s).__name__ == "UnspecifiedValue"
        for s in (*eqn.params["in_shardings"], *eqn.params["out_shardings"]))


def _scan(eqn, args, chunk):
    p = eqn.params
    body, nc, nk = p["jaxpr"], p["num_consts"], p["num_carry"]
    consts, init, xs = args[:nc], args[nc:nc + nk], args[nc + nk:]

    def step(carry, x):
        outs = eval_chunked(body.jaxpr, body.consts, [*consts, *carry, *x], chunk)
        return outs[:nk], outs[nk:]

    carry, ys = lax.scan(step, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                         unroll=p["unroll"])
    return [*carry, *ys]


def _bind(eqn, args):
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(eqn.params))
    return out if eqn.primitive.multiple_results else [out]


def _value(x):
    return x.value() if isinstance(x, Lazy) else x


def eval_chunked(jaxpr, consts, args, chunk: int, lazy: bool = False) -> list:
    """``jaxpr``'s outputs for ``consts`` and ``args`` (see the module); ``lazy``: outputs
    may be :class:`Lazy` (a nested ``jit`` evaluated in line)."""
    env = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for v, x in zip((*jaxpr.constvars, *jaxpr.invars), (*consts, *args)):
        env[v] = x
    for eqn in jaxpr.eqns:
        args_ = [read(v) for v in eqn.invars]
        name, out = eqn.primitive.name, None
        if name == "random_bits":
            bits = _bits(args_[0], eqn.params, chunk)
            out = None if bits is None else [bits]
        elif name in ELEMENTWISE and any(isinstance(a, Lazy) for a in args_):
            one = _elementwise(eqn, args_)
            out = None if one is None else [one]
        elif _inline(eqn):
            inner = eqn.params["jaxpr"]
            out = eval_chunked(inner.jaxpr, inner.consts, args_, chunk, lazy=True)
        elif name == "scan":
            out = _scan(eqn, [_value(a) for a in args_], chunk)
        if out is None:
            out = _bind(eqn, [_value(a) for a in args_])
        for v, x in zip(eqn.outvars, out):
            env[v] = x
    outs = [read(v) for v in jaxpr.outvars]
    return outs if lazy else [_value(x) for x in outs]


__all__ = ["eval_chunked"]
