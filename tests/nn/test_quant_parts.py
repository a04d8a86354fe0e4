"""A layer on a concatenation with 8-bit activations, quantized part by part
(:meth:`ditax.nn.quant_dot.QuantSpec.quantize_parts`, :meth:`ditax.nn.Linear.joined_input`):
the same numbers, bit for bit, as quantizing the concatenation (the slow reference: the
concatenation through the layer's own call), for int8 (int32 products of the parts summed)
and fp8 (8-bit parts joined), weights only and full precision; a token of zeros keeps the
scale 1."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.nn.linear import Linear
from ditax.nn.quant import QuantizedInput, QuantizedParts, QuantSpec, quantize_linear

B, S, N, K, M, OUT = 2, 8, 3, 16, 40, 24


def _parts(rng, dtype):
    o = rng.standard_normal((B, S, N, K)).astype(np.float32) * 2.0
    mlp = rng.standard_normal((B, S, M)).astype(np.float32) * 0.5
    mlp[0, 1] *= 40.0          # one token whose max sits in the second part
    o[1, 2] = 0.0
    mlp[1, 2] = 0.0            # one token of zeros
    return jnp.asarray(o, dtype), jnp.asarray(mlp, dtype)


def _layer(dtype, mode, activations, seed=0):
    lin = Linear(N * K + M, OUT, dtype=dtype, param_dtype=dtype, rngs=nnx.Rngs(seed))
    lin.bias = nnx.Param(jnp.linspace(-1.0, 1.0, OUT, dtype=dtype))
    return lin if mode == "none" else quantize_linear(lin, mode, activations)


@pytest.mark.parametrize("mode,activations", [("int8", True), ("fp8", True), ("int8", False),
                                              ("none", False)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_joined_input_is_the_concatenation(rng, mode, activations, dtype):
    """``lin(lin.joined_input([o [B,S,N,K], mlp [B,S,M]], 2))`` equals ``lin(concatenate)``
    exactly; with int8 activations the input is kept as parts (two int32 products)."""
    o, mlp = _parts(rng, dtype)
    lin = _layer(dtype, mode, activations)
    joined = jnp.concatenate([o.reshape(B, S, N * K), mlp], -1)
    x = lin.joined_input([o, mlp], 2)
    want = {("int8", True): QuantizedParts, ("fp8", True): QuantizedInput}.get(
        (mode, activations), jnp.ndarray)
    assert isinstance(x, want), type(x)
    np.testing.assert_array_equal(np.asarray(lin(x), np.float32),
                                  np.asarray(lin(joined), np.float32))


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_parts_quantize_as_the_concatenation(rng, mode):
    """The parts' 8-bit values, flattened and joined, and their shared per-token scale are
    those of the concatenation quantized per token (a zero token: scale 1, values 0)."""
    o, mlp = _parts(rng, jnp.bfloat16)
    spec = QuantSpec(mode, True)
    ref = spec.quantize_input(jnp.concatenate([o.reshape(B, S, N * K), mlp], -1))
    got = spec.quantize_parts([o, mlp], 2)
    values = (jnp.concatenate([v.reshape(B, S, -1) for v in got.values], -1)
              if isinstance(got, QuantizedParts) else got.values)
    np.testing.assert_array_equal(np.asarray(got.scale), np.asarray(ref.scale))
    np.testing.assert_array_equal(np.asarray(values, np.float32),
                                  np.asarray(ref.values, np.float32))
    assert float(got.scale[1, 2]) == 1.0 and not np.any(np.asarray(values[1, 2], np.float32))


def test_parts_refuse_another_spec_and_width(rng):
    """The parts' dot takes the plain layer's spec and the kernel's full input width, else
    one-line errors naming what it got."""
    o, mlp = _parts(rng, jnp.float32)
    spec = QuantSpec("int8", True)
    x = spec.quantize_parts([o, mlp], 2)
    q = jnp.ones((N * K + M, OUT), jnp.int8)
    s = jnp.ones((OUT,), jnp.float32)
    with pytest.raises(ValueError, match="not '...nk,nko->...o'"):
        spec.einsum("...nk,nko->...o", x, q, s, jnp.float32)
    with pytest.raises(ValueError, match=f"the parts hold {N * K + M} inputs, the kernel 100"):
        spec.einsum("...i,io->...o", x, jnp.ones((100, OUT), jnp.int8), s, jnp.float32)
