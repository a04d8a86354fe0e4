"""Wan's FeedForward with ``proj_in`` in column chunks (the TPU path: each chunk's kernel slice
gathered whole, GELU'd into its columns of the hidden) against the one-dot path, forward and
gradient on a context mesh; and where the chunked path is chosen (TPU, kernel split over its
input dim only)."""

import jax
import jax.numpy as jnp
from flax import nnx

import ditax
from ditax.models.wan.feed_forward import TPU_COLUMN_CHUNKS, FeedForward, ffn_chunks
from ditax.parallel import ShardingContext, make_mesh
from wan_reference import rel_err


def test_chunked_proj_in_equals_one_dot_forward_and_gradient(rng):
    """dim 32, ffn 512 (4 chunks of 128 columns), float32, context=8 mesh (16 tokens): the
    output and the gradients w.r.t. the input and every parameter equal the one-dot path's."""
    ffn = FeedForward(32, 512, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    gdef, state = nnx.split(ffn)
    ctx = ShardingContext(make_mesh({"context": 8}))
    x = jnp.asarray(rng.standard_normal((1, 16, 32)), jnp.float32)
    ct = jnp.asarray(rng.standard_normal((1, 16, 32)), jnp.float32)

    def loss(state, x, chunks):
        y = nnx.merge(gdef, state)(ctx.constrain(x, ("act_batch", "act_seq", "act_embed")),
                                   ctx, chunks=chunks)
        return jnp.sum(y * ct), y

    run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
    (_, y1), (gs1, gx1) = run(state, x, 1)
    (_, y4), (gs4, gx4) = run(state, x, TPU_COLUMN_CHUNKS)
    assert rel_err(y4, y1) < 1e-6
    assert rel_err(gx4, gx1) < 1e-6
    flat1, flat4 = jax.tree.leaves(gs1), jax.tree.leaves(gs4)
    assert len(flat1) == 4 and all(rel_err(a, b) < 1e-6 for a, b in zip(flat4, flat1))


def test_chunks_only_on_tpu_with_the_kernel_split_over_its_input():
    """4 chunks on TPU when fsdp / context split proj_in's input dim; 1 on CPU, without a mesh,
    with a tensor axis (columns split: a chunk would cross shards) or columns that are no
    whole 128-lane tiles per chunk."""
    ctx8 = ShardingContext(make_mesh({"context": 8}))
    assert ffn_chunks(ctx8, 5120, 13824) == 1                       # this process: CPU
    with ditax.target_platform("tpu"):
        assert ffn_chunks(ctx8, 5120, 13824) == TPU_COLUMN_CHUNKS == 4
        assert ffn_chunks(ShardingContext(make_mesh({"fsdp": 2, "context": 4})), 5120,
                          13824) == 4
        assert ffn_chunks(ShardingContext(make_mesh({"context": 4, "tensor": 2})), 5120,
                          13824) == 1
        assert ffn_chunks(ctx8, 5120, 640) == 1                     # 160 columns a chunk
        assert ffn_chunks(ShardingContext(None), 5120, 13824) == 1


def test_chunked_proj_in_keeps_an_unmerged_lora(rng):
    """An unmerged LoRA on ``proj_in`` (ditax.lora.unmerged.LoraLinear, as LoRA inference and
    training put it there): the chunked path adds its terms like the one-dot path, forward and
    gradient w.r.t. the LoRA factors (the chunked dense shortcut read only the base kernel)."""
    from ditax.lora.unmerged import LoraLinear

    ffn = FeedForward(32, 512, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    r = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    ffn.proj_in = LoraLinear(ffn.proj_in, r(2, 32) * 0.3, r(2, 512) * 0.3, jnp.ones((2,)),
                             (0, 0), None, jnp.ones((1,)))
    gdef, state = nnx.split(ffn)
    ctx = ShardingContext(make_mesh({"context": 8}))
    x, ct = r(1, 16, 32), r(1, 16, 32)

    def loss(state, chunks):
        y = nnx.merge(gdef, state)(x, ctx, chunks=chunks)
        return jnp.sum(y * ct), y

    run = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, y1), g1 = run(state, 1)
    (_, y4), g4 = run(state, TPU_COLUMN_CHUNKS)
    plain = nnx.merge(*nnx.split(FeedForward(32, 512, dtype=jnp.float32,
                                             param_dtype=jnp.float32, rngs=nnx.Rngs(0))))
    assert rel_err(y1, plain(x, ctx, chunks=1)) > 1e-2          # the LoRA changes the output
    assert rel_err(y4, y1) < 1e-6
    for name in ("lora_down", "lora_up"):
        a, b = g4["proj_in"][name][...], g1["proj_in"][name][...]
        assert rel_err(a, b) < 1e-6, name
