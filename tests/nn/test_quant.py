"""ditax.nn.quant on one Linear: int8 / fp8 weights (and per-token activations) against the
float32 layer, on a Wan-1.3B-width layer (in 1536, out 384, LeCun-normal kernel, x ~ N(0, 1)).

Stated bounds on the relative error of the output (measured here): int8 weights 1e-2
(5.1e-3; per-weight step max|w| / 127 over 1536 inputs), int8 weights + activations 1.5e-2
(9.5e-3), fp8 e4m3 weights 4e-2 (2.6e-2; 3 mantissa bits), fp8 both 5e-2 (3.7e-2). Every
dot form of Linear (``[in, out]``, head-major ``out_heads``, from heads / head-major input)
with 8-bit weights equals the float einsum of the dequantized kernel to float rounding, so the
views and scales are placed right."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.nn.linear import Linear
from ditax.nn.quant import QuantSpec, dequantize, native_dots, quantize_linear

D_IN, D_OUT, HEADS = 1536, 384, 3
BOUND = {("int8", False): 1e-2, ("int8", True): 1.5e-2, ("fp8", False): 4e-2,
         ("fp8", True): 5e-2}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def layer(out_heads=None):
    return Linear(D_IN, D_OUT, dtype="float32", param_dtype="float32", rngs=nnx.Rngs(0),
                  out_heads=out_heads)


def test_quantized_linear_error_bound():
    """Each mode against the float32 layer (one compile); the fp8 x fp8 dot as the platform
    would run it natively and its widened emulation give the same numbers (fp8 values are
    exact in float32)."""
    x = jax.random.normal(jax.random.key(1), (1, 64, D_IN))
    modes = list(BOUND)
    qs = [quantize_linear(layer(), mode, act) for mode, act in modes]
    native = quantize_linear(layer(), "fp8", True)
    native.quant = QuantSpec("fp8", True, native=True)
    y_ref, ys, y_nat = jax.jit(lambda f, qs, n, x: (f(x), [q(x) for q in qs], n(x)))(
        layer(), qs, native, x)
    errs = {}
    for (mode, act), q, y in zip(modes, qs, ys):
        assert q.kernel[...].dtype == {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}[mode]
        assert q.kernel_scale[...].shape == (D_OUT,)
        errs[mode, act] = rel(y, y_ref)
        assert 1e-4 < errs[mode, act] < BOUND[mode, act], (mode, act, errs[mode, act])
    assert rel(y_nat, ys[modes.index(("fp8", True))]) < 1e-6
    print(errs)


def _dequantized(q, heads=None, din=D_IN, dout=D_OUT):
    d = Linear(din, dout, dtype="float32", param_dtype="float32", rngs=nnx.Rngs(0),
               out_heads=heads)
    d.kernel = nnx.Param(dequantize(q.kernel[...], q.kernel_scale[...], jnp.float32))
    return d


@jax.jit
def _forms(q, d, qh, dh, sq, sd, x, hm):
    """(8-bit, dequantized float) pairs of every dot form."""
    return ((q(x), d(x)), (q.to_head_major(x, HEADS), d.to_head_major(x, HEADS)),
            (qh(x), dh(x)), (qh.to_head_major(x, HEADS), dh.to_head_major(x, HEADS)),
            (sq.from_head_major(hm), sd.from_head_major(hm)),
            (sq.from_heads(jnp.swapaxes(hm, 1, 2)), sd.from_heads(jnp.swapaxes(hm, 1, 2))))


def test_every_dot_form_uses_the_scales_right():
    """8-bit weights only: each of Linear's dots == the float dot of the dequantized kernel
    (plain and head-major kernels); activations on: int8 x int8 -> int32 in the HLO."""
    x = jax.random.normal(jax.random.key(2), (1, 16, D_IN))
    hm = jax.random.normal(jax.random.key(4), (1, HEADS, 16, D_OUT // HEADS))
    q, qh = quantize_linear(layer(), "int8"), quantize_linear(layer(HEADS), "int8")
    sq = quantize_linear(Linear(D_OUT, 256, dtype="float32", param_dtype="float32",
                                rngs=nnx.Rngs(3)), "fp8")
    pairs = _forms(q, _dequantized(q), qh, _dequantized(qh, HEADS), sq,
                   _dequantized(sq, None, D_OUT, 256), x, hm)
    for i, (a, b) in enumerate(pairs):
        assert rel(a, b) < 1e-6, i
    qa = quantize_linear(layer(HEADS), "int8", activations=True)
    hlo = jax.jit(lambda m, x: m.to_head_major(x, HEADS)).lower(qa, x).as_text()
    assert "xi8>, tensor<" in hlo and "-> tensor<1x3x16x128xi32>" in hlo, hlo[-2000:]


def test_native_dot_table():
    """Weights-only never native; int8 x int8 on TPU v5e / v6e, fp8 x fp8 on H100 / H200."""
    assert not native_dots("int8", False, "tpu", "TPU v6 lite")
    assert native_dots("int8", True, "tpu", "TPU v6 lite")
    assert native_dots("int8", True, "tpu", "TPU v5 lite")
    assert not native_dots("fp8", True, "tpu", "TPU v6 lite")
    assert native_dots("fp8", True, "gpu", "NVIDIA H200")
    assert not native_dots("int8", True, "gpu", "NVIDIA H200")
    assert not native_dots("int8", True, "cpu", "cpu")
    assert not native_dots("fp8", True, "cpu", "cpu")


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_the_loaders_quantizer_takes_a_stack_a_layer_at_a_time(mode):
    """:func:`ditax.nn.quant.reader`'s ``convert`` on a stacked kernel ``[layers, in, out]``
    (quantized layer by layer on threads) equals the whole slice quantized at once, element
    for element, whole or a device's slice of it; one layer and an unstacked kernel too."""
    import ml_dtypes

    from ditax.nn.quant import STORED, quantize_values, reader

    w = np.random.default_rng(0).standard_normal((5, 48, 40)).astype(ml_dtypes.bfloat16)
    convert, scale = reader(mode)(lambda index: np.asarray(w[index], np.float32), w.shape,
                                  True)
    assert scale.shape == (5, 40)
    for index in [(slice(None),) * 3, (slice(1, 4), slice(None), slice(8, 24)),
                  (slice(2, 3),)]:
        idx = index + (slice(None),) * (3 - len(index))
        got = convert(w[idx], index)
        want = quantize_values(np.asarray(w[idx]), scale[idx[:1] + idx[2:]][:, None, :],
                               mode)
        assert got.dtype == STORED[mode] and got.shape == want.shape
        assert np.array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8)), index
    convert2, scale2 = reader(mode)(lambda index: np.asarray(w[0][index], np.float32),
                                    w.shape[1:], False)
    got = convert2(w[0], (slice(None),) * 2)
    want = quantize_values(np.asarray(w[0]), scale2[None, :], mode)
    assert np.array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8))
