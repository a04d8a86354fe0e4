"""Every Pallas kernel on the chip against its jnp reference on the CPU (fresh random inputs):
splash and flash forward and backward (the table's tiles, and tiles with compute sub-blocks,
backward tiles of their own and masked keys), sage, the int8 x int8 Linear, host offload's
streamed forward against the resident one, bit for bit, VSA's table fine pass, and Wan's fused
attention projections (q, k, v from the block's norm in one kernel)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tpu_fixtures import chip, host, on  # noqa: F401  (fixtures)

import ditax
from ditax.attention import attend
from ditax.attention.reference import reference_attention

pytestmark = pytest.mark.tpu


def _qkv(rng, B=1, L=640, N=2, K=128):
    f = lambda: rng.standard_normal((B, L, N, K)).astype(np.float32)  # noqa: E731
    return f(), f(), f()


def _platform(device):
    kind = getattr(device, "device_kind", "")
    return ditax.target_platform(device.platform, device_kind=kind)


def _run(device, fn, *arrays):
    """``jax.jit(fn)`` on ``arrays`` committed to ``device``, traced for its platform."""
    with _platform(device):
        return jax.jit(fn)(*[jax.device_put(a, device) for a in arrays])


def _loss_grads(att, mask):
    def loss(q, k, v):
        o = att(q, k, v, mask)
        w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
        return jnp.sum(o.astype(jnp.float32) * w)
    return jax.grad(loss, argnums=(0, 1, 2))


def _check_on_chip(chip, host, kernel, ref, q, k, v, mask):
    """``kernel`` on the chip against ``ref`` on the CPU: values within 2e-2, each q / k / v
    gradient within 5% of the reference's largest entry."""
    o = np.asarray(_run(chip, kernel, q, k, v, mask), np.float32)
    np.testing.assert_allclose(o, np.asarray(_run(host, ref, q, k, v, mask)), atol=2e-2)
    g = _run(chip, _loss_grads(kernel, mask), q, k, v)
    g_ref = _run(host, _loss_grads(ref, mask), q, k, v)
    for a, b in zip(g, g_ref):
        b = np.asarray(b)
        np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=5e-2 * np.abs(b).max())


CASES = [("splash", {}), ("flash", {}),
         ("flash", dict(block_q=256, block_kv=512, block_kv_compute=128, block_q_bwd=128,
                        block_kv_bwd=256))]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("backend,opts", CASES)
def test_attention_kernels_forward_and_backward(chip, host, rng, backend, opts, masked):
    q, k, v = _qkv(rng)
    mask = (rng.random((1, q.shape[1])) > 0.2) if masked else np.ones((1, q.shape[1]), bool)
    bf = lambda x: x.astype(jnp.bfloat16)   # noqa: E731

    def kernel(q, k, v, m):
        return attend(bf(q), bf(k), bf(v), backend=backend, kv_mask=m, **opts)

    def ref(q, k, v, m):   # the same bf16-rounded inputs, float32 arithmetic
        up = lambda x: bf(x).astype(jnp.float32)   # noqa: E731
        return reference_attention(up(q), up(k), up(v), kv_mask=m)

    _check_on_chip(chip, host, kernel, ref, q, k, v, mask)


def test_sage_kernel_against_the_reference(chip, host, rng):
    q, k, v = _qkv(rng)
    bf = lambda x: x.astype(jnp.bfloat16)   # noqa: E731
    o = _run(chip, lambda q, k, v: attend(bf(q), bf(k), bf(v), backend="sage"), q, k, v)
    ref = _run(host, lambda q, k, v: reference_attention(q, k, v), q, k, v)
    np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(ref), atol=6e-2)


def test_int8_linear_on_the_mxu_equals_the_cpu(chip, host, rng):
    """W+A int8 in float32: the s8 x s8 -> s32 products are exact on both, so the chip's
    output equals the CPU's emulation to float32 rounding of the rescale."""
    from flax import nnx

    from ditax.nn.linear import Linear
    from ditax.nn.quant import quantize_linear

    x = rng.standard_normal((64, 256)).astype(np.float32)
    lin = Linear(256, 384, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    quantize_linear(lin, "int8", activations=True)
    gdef, state = nnx.split(lin)

    def fwd(state, x):
        return nnx.merge(gdef, state)(x)

    outs = [np.asarray(jax.jit(fwd)(jax.device_put(state, d), on(d, x))) for d in (chip, host)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_offloaded_forward_equals_resident_bit_for_bit(chip, rng):
    """The tiny Wan with its blocks' weights in host memory, streamed a block at a time,
    against the same weights resident on the chip."""
    from ditax.config import load_config
    from ditax.models.base import model_family
    from ditax.parallel import make_mesh

    outs = []
    for offload in ("none", "host"):
        cfg = load_config("tiny", [f"model.offload={offload}", "attention.backend=xla"])
        mesh = make_mesh(cfg.mesh, [chip])
        fam = model_family(cfg.model, cfg.attention)
        args, kw = fam.random_inputs(1, (3, 8, 8), 16, np.random.default_rng(0))
        with _platform(chip):
            tr = fam.random_transformer(mesh, seed=0)
            outs.append(np.asarray(tr(*on(chip, *args), **kw)))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("group, grid, tile", [(1, (3, 6, 10), (2, 4, 4)),
                                               (3, (3, 6, 10), (2, 4, 4)),
                                               (0, (3, 6, 10), (2, 4, 4)),
                                               (0, (7, 16, 20), (3, 16, 8))])
def test_vsa_table_kernels_against_the_gather(chip, host, rng, group, grid, tile):
    """VSA's table fine pass (``attention.vsa_fine=table``) compiled on the chip, one, three
    and the chosen number of picked key tiles a grid step (5 picks: the last step padded),
    against the jnp gather on the CPU: a padded grid (12 tiles of 32 tokens, the padding keys
    masked), bf16, K = 128 (packed), values and q / k / v gradients; and 9 tiles of 384
    tokens (3 x 16 x 8, ``attention.tile=auto``'s kind: blocks no power of two)."""
    from ditax.attention.sparse.tiles import TileOrder
    from ditax.attention.sparse.vsa import fine
    from ditax.attention.sparse.vsa_table import fine_table

    order = TileOrder(grid, tile)
    t, tiles = order.tile_len, int(np.prod(order.tiles))
    q, k, v = _qkv(rng, L=order.length)
    mask = jnp.asarray(order.valid)[None]
    picks = jnp.asarray(np.argsort(rng.random((1, 2, tiles, tiles)), -1)[..., :5], jnp.int32)
    bf = lambda x: x.astype(jnp.bfloat16)   # noqa: E731

    def kernel(q, k, v, m):
        return fine_table(bf(q), bf(k), bf(v), picks, t, m, group=group,
                          interpret=chip.platform != "tpu")   # the CPU stand-in: interpreted

    def ref(q, k, v, m):
        up = lambda x: bf(x).astype(jnp.float32)   # noqa: E731
        return fine(up(q), up(k), up(v), picks, t, m)

    _check_on_chip(chip, host, kernel, ref, q, k, v, mask)


@pytest.mark.parametrize("backend", ["splash", "flash"])
def test_block_sparse_kernels_with_384_token_tiles(chip, host, rng, backend):
    """Splash and flash with a sliding-tile block table over 384-token 3 x 16 x 8 tiles (one
    kernel block each: no power of two; a 7 x 16 x 20 grid padded to 9 x 16 x 24, the padding
    keys masked), bf16, against dense float32 attention under the table's token mask on the
    CPU: values and q / k / v gradients."""
    from ditax.attention.flash import flash_attention
    from ditax.attention.sparse.masks import BlockTable, element_mask, sliding_tile_blocks
    from ditax.attention.sparse.tiles import TileOrder
    from ditax.attention.splash import splash_attention

    order = TileOrder((7, 16, 20), (3, 16, 8))
    blocks = sliding_tile_blocks(order, (0, 0, 1))
    table, t = BlockTable.of(order, blocks), order.tile_len
    q, k, v = _qkv(rng, L=order.length)
    mask = np.asarray(order.valid)[None]
    keep = jnp.asarray(element_mask(order, blocks))
    bf = lambda x: x.astype(jnp.bfloat16)   # noqa: E731

    fn = splash_attention if backend == "splash" else flash_attention

    def kernel(q, k, v, m):
        return fn(bf(q), bf(k), bf(v), kv_mask=m, block_q=t, block_kv=t, block_table=table,
                  interpret=chip.platform != "tpu")      # the CPU stand-in: interpreted

    def ref(q, k, v, m):
        up = lambda x: bf(x).astype(jnp.float32)   # noqa: E731
        s = jnp.einsum("blnk,btnk->bnlt", up(q), up(k)) * q.shape[-1] ** -0.5
        s = jnp.where(keep[None, None] & m[:, None, None, :], s, -jnp.inf)
        return jnp.einsum("bnlt,btnk->blnk", jax.nn.softmax(s, axis=-1), up(v))

    _check_on_chip(chip, host, kernel, ref, q, k, v, mask)


def test_fused_projections_of_the_normed_input(chip, host, rng):
    """:func:`~ditax.nn.head_projection.project_many` compiled on the chip (q with norm, RoPE
    and scale; k with norm and RoPE; v bare; the block's LayerNorm with one sample's adaLN
    terms applied to the rows in VMEM) against :func:`reference_many` on the CPU: 640 tokens in
    blocks of 320, two heads of 128; each output within four bfloat16 steps of the
    reference's largest value."""
    from ditax.nn.head_projection import HeadProjection, project_many, reference_many
    from ditax.nn.rope import pair_tables

    L, D, N, K = 640, 256, 2, 128
    bf = lambda *s: (rng.standard_normal(s) * 0.5).astype(jnp.bfloat16)  # noqa: E731
    x = (rng.standard_normal((1, L, D)) * 2 + 0.5).astype(jnp.bfloat16)
    ws = [bf(N, D, K) / 8 for _ in range(3)]
    b, nw = rng.standard_normal(N * K) * 0.2, 1 + 0.1 * rng.standard_normal(N * K)
    mul, add = 1 + 0.2 * rng.standard_normal((1, 1, D)), 0.1 * rng.standard_normal((1, 1, D))
    cos, sin = pair_tables(rng.uniform(0, 6, (L, K // 2)))
    specs = (HeadProjection(norm=True, rope=True, scale=K ** -0.5),
             HeadProjection(norm=True, rope=True), HeadProjection())
    args = [np.asarray(a, np.float32) if a.dtype != jnp.bfloat16 else a
            for a in (x, *ws, b, nw, cos, sin, mul, add)]

    def fused(x, w0, w1, w2, b, nw, cos, sin, mul, add):
        layers = [(w, bb, n_, s) for w, bb, n_, s in zip((w0, w1, w2), (b, None, b),
                                                          (nw, nw, None), specs)]
        return project_many(x, layers, (cos, sin), (mul, add, 1e-6),
                            interpret=chip.platform == "cpu")    # DITAX_TPU_TESTS=cpu

    def ref(x, w0, w1, w2, b, nw, cos, sin, mul, add):
        return reference_many(x, (w0, w1, w2), (b, None, b), (nw, nw, None), cos, sin, mul,
                              add, specs, 1e-6)

    got = _run(chip, fused, *args)
    want = _run(host, ref, *args)
    for g, r in zip(got, want):
        g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
        assert g.shape == (1, N, L, K)
        np.testing.assert_allclose(g, r, atol=4 * 2.0 ** -8 * np.abs(r).max())
