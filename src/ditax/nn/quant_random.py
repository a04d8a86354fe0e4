"""Random 8-bit block linears drawn in 8 bits (``ditax bench``'s random transformer under
``model.quantize``): :func:`random_kernel` draws one kernel's 8-bit values and scales, and
:func:`random_quantized` puts them into a model's init values in place of its float kernels.

The point is memory: a random 8-bit model built by quantizing a float init would hold every
quantized kernel in full precision first (twice the int8 model's bytes in bf16, four times in
float32); drawn in 8 bits inside the jitted init program
(:func:`ditax.models.common.loaded.init_module`), the float kernels the build also draws go
unused and XLA drops them, so only the 8-bit values and their scales are ever written.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.nn.quant import QMAX, SCALE, STORED, quantize_values, quantized_kernels

LECUN_STD = 0.87962566103423978   # std of a standard normal truncated to [-2, 2]


def random_kernel(key, shape, mode: str):
    """A random 8-bit kernel of ``shape`` and its float32 scales, drawn in 8 bits (no float
    kernel exists): what quantizing flax's LeCun-normal init gives. ``z``, a standard normal
    truncated to [-2, 2] (the init's), is rounded straight to ``q = z · qmax / 2`` (|q| <=
    qmax); every output channel's scale is ``2 / (qmax · 0.8796 · sqrt(fan_in))``, so
    ``q · s = z / (0.8796 · sqrt(fan_in))``, the init's weight (fan_in: the input axis,
    ``shape[-2]``, in both layouts)."""
    qmax = QMAX[mode]
    z = jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32)
    q = quantize_values(z, 2.0 / qmax, mode)
    scale = 2.0 / (qmax * LECUN_STD * float(np.sqrt(shape[-2])))
    return q, jnp.full(tuple(shape[:-2]) + tuple(shape[-1:]), scale, jnp.float32)


def random_quantized(abstract, values: dict, seed: int) -> dict:
    """``values`` (the pure dict of a float model's state as its build drew it) with the
    8-bit kernels of ``abstract`` (the same model's state after :func:`quantize_module`) and
    their scales drawn by :func:`random_kernel` (one key a kernel, from ``seed``) in place
    of the float kernels, which go unused: inside one jitted init program XLA drops them."""
    key = jax.random.fold_in(jax.random.key(seed), 0x8B17)
    kernels = nnx.to_pure_dict(abstract) if isinstance(abstract, nnx.State) else abstract

    def at(d, path):
        for p in path:
            d = next(v for k, v in d.items() if str(k) == p)
        return d

    for i, path in enumerate(quantized_kernels(kernels)):
        want = at(kernels, path)
        mode = next(m for m, dt in STORED.items() if dt == jnp.dtype(want.dtype))
        q, s = random_kernel(jax.random.fold_in(key, i), tuple(want.shape), mode)
        parent = at(values, path[:-1])
        name = next(k for k in parent if str(k) == path[-1])
        parent[name] = q
        parent[SCALE] = s
    return values


__all__ = ["LECUN_STD", "random_kernel", "random_quantized"]
