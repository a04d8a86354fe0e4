"""Wan's chunked FeedForward with 8-bit weights and activations: ``proj_in``'s input is
quantized once, before the column loop (``Linear.column_input``), and the chunks give the
one-dot path's output bit for bit (each column one ``int8 × int8 → int32`` dot over the whole
input, the same per-token and per-channel scales)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.models.wan.feed_forward import TPU_COLUMN_CHUNKS, FeedForward
from ditax.nn.quant import QuantizedInput, quantize_linear
from ditax.parallel import ShardingContext


def test_int8_wa_chunked_proj_in_equals_one_dot_bit_for_bit(rng):
    """dim 64, ffn 512 (4 chunks of 128 columns); built, quantized and run in one jit (eager
    init and quantization would dispatch op by op)."""
    x = jnp.asarray(rng.standard_normal((1, 16, 64)), jnp.float32)

    @jax.jit
    def run(x):
        ffn = FeedForward(64, 512, dtype=jnp.float32, param_dtype=jnp.float32,
                          rngs=nnx.Rngs(0))
        for lin in (ffn.proj_in, ffn.proj_out):
            quantize_linear(lin, "int8", activations=True)
        assert isinstance(ffn.proj_in.column_input(x), QuantizedInput)
        return tuple(ffn(x, ShardingContext(None), chunks=c) for c in (1, TPU_COLUMN_CHUNKS))

    one, chunked = run(x)
    assert np.any(np.asarray(one)) and jnp.array_equal(chunked, one)
