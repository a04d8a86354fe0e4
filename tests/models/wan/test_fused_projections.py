"""The attention projections in one kernel (:mod:`ditax.nn.head_projection`,
``model.projections``): the kernel against the XLA path it replaces on fresh random inputs
(interpreted), its gradient the reference's, a bfloat16 Wan forward and gradient with the
fused q / k against XLA's, and where ``auto`` picks it and ``fused`` is refused."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ditax
from ditax.config import AttentionConfig
from ditax.errors import ConfigError
from ditax.models.wan.attention import fused_projections
from ditax.nn.head_projection import HeadProjection, project_heads, reference
from ditax.nn.rope import pair_tables
from wan_reference import make_diffusers_wan, rel_err

SPLASH = AttentionConfig(backend="splash", block_q=128, block_kv=128, padded_keys="duplicate")


def _inputs(seed, b=2, length=72, d=256, n=2, k=128, bias=True):
    ks = jax.random.split(jax.random.key(seed), 5)
    x = jax.random.normal(ks[0], (b, length, d)).astype(jnp.bfloat16)
    w = (jax.random.normal(ks[1], (n, d, k)) * d ** -0.5).astype(jnp.bfloat16)
    bias = jax.random.normal(ks[2], (n * k,)) * 0.3 if bias else None
    nw = 1.0 + 0.2 * jax.random.normal(ks[3], (n * k,))
    angles = jax.random.uniform(ks[4], (length, k // 2), maxval=2 * np.pi)
    cos, sin = (jnp.asarray(t) for t in pair_tables(np.asarray(angles)))
    return x, w, bias, nw, cos, sin


def _ulps(got, want):
    """Largest difference in units of bfloat16's rounding step at the values' scale."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.abs(got - want).max() / (np.abs(want).max() * 2.0 ** -8))


def _exact(x, w, b, nw, cos, sin, spec):
    """The projection's values in float32 throughout (products at "highest"), unrounded."""
    n, _, k = w.shape
    f = lambda a: None if a is None else jnp.asarray(a, jnp.float32)  # noqa: E731
    y = jnp.einsum("bli,nik->bnlk", f(x), f(w), precision="highest")
    if b is not None:
        y = y + f(b).reshape(n, 1, k)
    if spec.norm:
        y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=(1, 3), keepdims=True) + spec.eps)
        y = y * f(nw).reshape(n, 1, k)
    if spec.rope:
        p = jnp.stack([-y[..., 1::2], y[..., 0::2]], -1).reshape(y.shape)
        y = y * cos + p * sin
    return y * spec.scale


@pytest.mark.parametrize("spec,bias", [
    (HeadProjection(norm=True, rope=True, scale=128 ** -0.5, rows=32), True),  # self q
    (HeadProjection(norm=True, rope=True, rows=32), False),                   # self k
    (HeadProjection(norm=True, scale=128 ** -0.5), True),                     # cross q
    (HeadProjection(rows=16), True)])                                         # bare
def test_kernel_equals_the_xla_path(spec, bias):
    """72 tokens in blocks of 32 or 16 (a partial last block), two heads: the XLA path's
    values, rounded at the same points (the sums' order only: a few elements one bfloat16
    step apart), as close to the exact values (float32 throughout) as those roundings allow."""
    x, w, b, nw, cos, sin = _inputs(int(spec.rows or 7) + bias, bias=bias)
    nw = nw if spec.norm else None
    rope = (cos, sin) if spec.rope else None
    got = project_heads(x, w, b, nw, rope, spec=spec, interpret=True)
    want = reference(x, w, b, nw, *(rope or (None, None)), spec)
    exact = _exact(x, w, b, nw, cos, sin, spec)
    assert got.shape == want.shape == (2, 2, 72, 128) and got.dtype == jnp.bfloat16
    assert _ulps(got, want) <= 2.0, _ulps(got, want)
    assert float(np.mean(np.asarray(got) != np.asarray(want))) < 1e-3
    assert _ulps(got, exact) <= 2.5, _ulps(got, exact)


def _pre_inputs(seed, b=2, length=72, d=256):
    """A residual stream's rows (offset and spread per token) and one sample's adaLN terms."""
    ks = jax.random.split(jax.random.key(seed), 4)
    x = (jax.random.normal(ks[0], (b, length, d)) * (1 + 3 * jax.random.uniform(
        ks[1], (b, length, 1))) + 0.7).astype(jnp.bfloat16)
    mul = 1.0 + 0.3 * jax.random.normal(ks[2], (b, 1, d))
    add = 0.2 * jax.random.normal(ks[3], (b, 1, d))
    return x, mul, add


def _qkv_layers(w, b, nw, seed):
    """q (norm, RoPE, scale), k (norm, RoPE, no bias), v (bare): three kernels of ``w``'s
    shape."""
    ws = [w] + [(jax.random.normal(jax.random.key(seed + i), w.shape) * w.shape[1] ** -0.5
                 ).astype(w.dtype) for i in (1, 2)]
    return [(ws[0], b, nw, HeadProjection(norm=True, rope=True, scale=128 ** -0.5, rows=32)),
            (ws[1], None, nw * 0.9, HeadProjection(norm=True, rope=True, rows=32)),
            (ws[2], b, None, HeadProjection(rows=32))]


@pytest.mark.parametrize("per_sample", [True, False])
def test_projections_of_the_normed_input_in_one_kernel(per_sample):
    """q, k and v of the block's norm (``pre``: LayerNorm, then ``* mul + add`` — one sample's
    adaLN terms ``[B, 1, D]``, or an affine norm's ``[D]``) in one kernel: each the XLA path's
    values (the normed input rounded once, as the block rounds it) within two bfloat16 steps."""
    from ditax.nn.head_projection import project_many, reference_many

    x, w, b, nw, cos, sin = _inputs(11)
    xr, mul, add = _pre_inputs(12)
    if not per_sample:
        mul, add = mul[0, 0], add[0, 0]
    layers = _qkv_layers(w, b, nw, 13)
    got = project_many(xr, layers, (cos, sin), (mul, add, 1e-6), interpret=True)
    ws, bs, nws, specs = zip(*layers)
    want = reference_many(xr, ws, bs, nws, cos, sin, mul, add, specs, 1e-6)
    assert len(got) == 3
    for g, r in zip(got, want):
        assert g.shape == r.shape == (2, 2, 72, 128) and g.dtype == jnp.bfloat16
        assert _ulps(g, r) <= 2.0, _ulps(g, r)
    # the norm reached the products: the raw rows give other values
    raw = reference_many(xr, ws, bs, nws, cos, sin, None, None, specs)
    assert _ulps(raw[2], want[2]) > 50


@pytest.mark.slow   # TRANSPOSED_INPUT is off; 2-6 s
def test_transposed_input_gives_the_same_values_and_gradient():
    """``transposed=True``: the hidden state handed over ``[B, D, L]`` (blocks of 128 token
    columns, transposed in VMEM) gives the rows-major call's values (the norm's float32 sums
    in another order: a few elements one bfloat16 step apart), and its gradient is the
    reference's (through the transpose)."""
    from ditax.nn.head_projection import project_many, reference_many

    x, w, b, nw, cos, sin = _inputs(51, length=256)
    xr, mul, add = _pre_inputs(52, length=256)
    layers = [(l[0], l[1], l[2], dataclasses.replace(l[3], rows=128))
              for l in _qkv_layers(w, b, nw, 53)]
    pre = (mul, add, 1e-6)
    rows = project_many(xr, layers, (cos, sin), pre, interpret=True)
    cols = project_many(jnp.swapaxes(xr, 1, 2), layers, (cos, sin), pre, transposed=True,
                        interpret=True)
    for a, r in zip(cols, rows):
        assert _ulps(a, r) <= 1.0, _ulps(a, r)
        assert float(np.mean(np.asarray(a) != np.asarray(r))) < 1e-3
    ws, bs, nws, specs = zip(*layers)
    g = jax.random.normal(jax.random.key(54), (2, 2, 256, 128))
    got = jax.grad(lambda xt: jnp.sum(project_many(
        xt, layers, (cos, sin), pre, transposed=True, interpret=True)[2].astype(
        jnp.float32) * g))(jnp.swapaxes(xr, 1, 2))
    want = jax.grad(lambda x: jnp.sum(reference_many(
        x, ws, bs, nws, cos, sin, mul, add, specs, 1e-6)[2].astype(jnp.float32) * g))(xr)
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(jnp.swapaxes(want, 1, 2), np.float32))


def test_normed_projections_gradient_is_the_references():
    from ditax.nn.head_projection import project_many, reference_many

    x, w, b, nw, cos, sin = _inputs(21)
    xr, mul, add = _pre_inputs(22)
    layers = _qkv_layers(w, b, nw, 23)
    ws, bs, nws, specs = zip(*layers)
    gs = jax.random.normal(jax.random.key(24), (3, 2, 2, 72, 128))

    def loss(outs):
        return sum(jnp.sum(o.astype(jnp.float32) * g) for o, g in zip(outs, gs))

    fused = jax.grad(lambda x, m, a, w0: loss(project_many(
        x, [(w0, b, nw, specs[0])] + layers[1:], (cos, sin), (m, a, 1e-6), interpret=True)),
        argnums=(0, 1, 2, 3))
    ref = jax.grad(lambda x, m, a, w0: loss(reference_many(
        x, (w0,) + ws[1:], bs, nws, cos, sin, m, a, specs, 1e-6)), argnums=(0, 1, 2, 3))
    for a, r in zip(fused(xr, mul, add, w), ref(xr, mul, add, w)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(r, np.float32))


def test_normed_projections_refuse_per_token_terms():
    from ditax.nn.head_projection import project_many

    x, w, b, nw, cos, sin = _inputs(31)
    xr, mul, add = _pre_inputs(32)
    per_token = jnp.broadcast_to(mul, (2, 72, 256))
    with pytest.raises(ValueError, match=r"terms are \(2, 72, 256\).*apply pre_norm first"):
        project_many(xr, _qkv_layers(w, b, nw, 33), (cos, sin), (per_token, add, 1e-6))
    with pytest.raises(ValueError, match="differ"):
        project_many(xr, [(w, b, None, HeadProjection()), (w[:1], b, None, HeadProjection())])


def test_row_blocks_divide_the_tokens_where_they_can():
    from ditax.nn.head_projection import rows_for

    assert rows_for(32768) == 512 and rows_for(75600) == 432      # 480p with copies, 720p
    assert rows_for(32760) == 512 and rows_for(72) == 72          # a partial block; clipped
    assert rows_for(72, 32) == 32
    with pytest.raises(ValueError, match="multiple of 8"):
        rows_for(100, 12)


def test_kernel_gradient_is_the_references():
    x, w, b, nw, cos, sin = _inputs(3)
    spec = HeadProjection(norm=True, rope=True, scale=128 ** -0.5, rows=32)
    g = jax.random.normal(jax.random.key(9), (2, 2, 72, 128))

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * g)

    fused = jax.grad(loss(lambda x, w, b, nw: project_heads(x, w, b, nw, (cos, sin), spec=spec,
                                                           interpret=True)), argnums=(0, 1, 2, 3))
    ref = jax.grad(loss(lambda x, w, b, nw: reference(x, w, b, nw, cos, sin, spec)),
                   argnums=(0, 1, 2, 3))
    for a, r in zip(fused(x, w, b, nw), ref(x, w, b, nw)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(r, np.float32))


def test_kernel_refuses_what_it_cannot_run():
    from ditax.nn.head_projection import why_not

    big = jax.ShapeDtypeStruct((40, 5120, 128), jnp.bfloat16)     # Wan 14B's q kernel
    tokens = jax.ShapeDtypeStruct((1, 32760, 5120), jnp.bfloat16)
    assert "MiB of VMEM" in why_not(tokens, big, HeadProjection(norm=True, rope=True))
    assert why_not(jax.ShapeDtypeStruct((1, 32760, 3072), jnp.bfloat16),   # Wan 2.2 5B's
                   jax.ShapeDtypeStruct((24, 3072, 128), jnp.bfloat16), HeadProjection()) is None
    x, w, b, nw, cos, sin = _inputs(4)
    with pytest.raises(ValueError, match="float32, not bfloat16"):
        project_heads(x.astype(jnp.float32), w, spec=HeadProjection())
    with pytest.raises(ValueError, match="multiples of 128"):
        project_heads(x[..., :192], w[:, :192, :64], spec=HeadProjection())
    with pytest.raises(ValueError, match="exactly when spec.rope"):
        project_heads(x, w, b, nw, spec=HeadProjection(norm=True, rope=True))


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    _, folder = make_diffusers_wan(tmp_path_factory.mktemp("fused"), heads=2, head_dim=128,
                                   layers=2)
    rng = np.random.default_rng(0)
    lat = rng.standard_normal((1, 4, 4, 16, 20)).astype(np.float32)   # 320 tokens + copies
    t = np.array([500.0], np.float32)
    text = rng.standard_normal((1, 7, 32)).astype(np.float32)
    return folder, (lat, t, text)


@pytest.mark.slow   # 8 s, and 16 s to build the diffusers model
def test_wan_forward_and_gradient_with_fused_projections(wan):
    """A bfloat16 Wan 1.3B-shaped layer pair (heads of 128) on splash with its tokens padded
    once: q and k fused (interpreted) against XLA's projections, the prediction and the
    gradient of the latents."""
    folder, (lat, t, text) = wan

    def run(mode):
        model = ditax.load_transformer(folder, dtype="bfloat16", attention=SPLASH,
                                       projections=mode)
        f = lambda x: model(x, t, text).astype(jnp.float32)  # noqa: E731
        w = jax.random.normal(jax.random.key(2), lat.shape)
        return (np.asarray(f(jnp.asarray(lat))),
                np.asarray(jax.grad(lambda x: jnp.sum(f(x) * w))(jnp.asarray(lat))))

    (out, grad), (out_x, grad_x) = run("fused"), run("xla")
    assert rel_err(out, out_x) <= 1e-2, rel_err(out, out_x)
    assert rel_err(grad, grad_x) <= 2e-2, rel_err(grad, grad_x)
    assert not np.array_equal(out, np.zeros_like(out))


def test_where_auto_fuses_and_fused_is_refused():
    """``auto``: the kernel on a TPU (compiled) only; ``fused``: the kernel anywhere it can
    run (interpreted off a TPU), a ConfigError naming why where it cannot; ``xla``: never."""
    from flax import nnx

    from ditax.attention import resolve
    from ditax.lora.unmerged import LoraLinear
    from ditax.nn import Linear
    from ditax.parallel.platform import Platform
    from ditax.parallel.sharding import ShardingContext

    lin = Linear(256, 256, out_heads=2, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                 rngs=nnx.Rngs(0))
    x, none = jax.ShapeDtypeStruct((1, 384, 256), jnp.bfloat16), ShardingContext()
    cpu = resolve("splash", {}, platform=Platform("cpu"))
    tpu = resolve("splash", {}, platform=Platform("tpu"))
    assert fused_projections("auto", cpu, none, x, lin) is None       # CPU: XLA's
    assert fused_projections("fused", cpu, none, x, lin) is True      # interpreted
    assert fused_projections("auto", tpu, none, x, lin) is False      # compiled
    assert fused_projections("xla", tpu, none, x, lin) is None
    plain = Linear(256, 256, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    assert fused_projections("auto", tpu, none, x, plain) is None
    with pytest.raises(ConfigError, match="not stored head-major"):
        fused_projections("fused", tpu, none, x, plain)
    lin.dtype = jnp.dtype(jnp.float32)
    assert fused_projections("auto", tpu, none, x, lin) is None
    with pytest.raises(ConfigError, match="float32, not bfloat16"):
        fused_projections("fused", tpu, none, x, lin)
    assert issubclass(LoraLinear, Linear)     # a LoRA-wrapped layer is not a plain Linear
    from ditax.models.wan.config import WanConfig, check_model

    fused = WanConfig(dtype="bfloat16", projections="fused")
    check_model(fused)                                            # one device: fine
    with pytest.raises(ConfigError, match="model.projections=fused runs bfloat16"):
        check_model(dataclasses.replace(fused, quantize="int8"))
    with pytest.raises(ConfigError, match="model.dtype is float32"):
        check_model(dataclasses.replace(fused, dtype="float32"))
    with pytest.raises(ConfigError, match="the mesh has 8 devices"):
        check_model(fused, {"data": 1, "fsdp": 2, "context": 4, "tensor": 1})


def test_image_attention_and_chunk_masked_calls_take_the_scaled_query():
    """Wan attention layers whose query is fused and pre-scaled, so every call they make
    gets ``scale=1.0``: image-to-video's cross-attention (its second call, over the image
    tokens), self-attention through the plain call and through the block-causal chunk calls
    (:class:`ChunkMaskedCall`, key masks) — each equal to XLA's projections (a query scaled
    twice would not be: the attention dominates a lone layer's output)."""
    from flax import nnx

    from ditax.attention import resolve
    from ditax.models.wan.attention import WanAttention
    from ditax.models.wan.causal import ChunkMaskedCall
    from ditax.models.wan.config import WanConfig
    from ditax.parallel.platform import Platform
    from ditax.parallel.sharding import ShardingContext

    cfg = WanConfig(num_attention_heads=2, attention_head_dim=128, dtype="bfloat16",
                    param_dtype="float32", image_dim=32, added_kv_proj_dim=256)
    ks = jax.random.split(jax.random.key(5), 4)
    x = jax.random.normal(ks[0], (1, 256, 256)).astype(jnp.bfloat16)
    img = jax.random.normal(ks[1], (1, 16, 256)).astype(jnp.bfloat16)
    cos, sin = (jnp.asarray(t) for t in pair_tables(np.asarray(
        jax.random.uniform(ks[2], (256, 64), maxval=6.0))))
    call = resolve("splash", dict(block_q=128, block_kv=128), platform=Platform("cpu"))
    chunks = ChunkMaskedCall(call, np.repeat(np.arange(2), 128), context_chunks=1)
    none = ShardingContext()
    text = jax.random.normal(ks[3], (1, 24, 256)).astype(jnp.bfloat16)
    outs = {}
    for mode in ("fused", "xla"):
        c = dataclasses.replace(cfg, projections=mode)
        cross = WanAttention(c, rngs=nnx.Rngs(0), added_kv=True)   # q fused, no RoPE
        self_attn = WanAttention(c, rngs=nnx.Rngs(1))
        outs[mode] = [np.asarray(o, np.float32) for o in (
            cross(x, text, call, none, image=img),
            self_attn(x, x, call, none, rope=(cos, sin)),
            self_attn(x, x, chunks, none, rope=(cos, sin)))]
    errs = [rel_err(a, b) for a, b in zip(outs["fused"], outs["xla"])]
    assert max(errs) <= 1e-2, errs
    assert rel_err(outs["xla"][1], outs["xla"][2]) > 10 * max(errs)   # the masks reached it


def _pallas_outputs(jaxpr) -> list:
    """The output counts of every ``pallas_call`` in ``jaxpr`` and the jaxprs inside it."""
    found = []
    for e in jaxpr.eqns:
        if e.primitive.name == "pallas_call":
            found.append(len(e.outvars))
            continue
        for v in e.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else [v]):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    found += _pallas_outputs(sub)
    return sorted(found)


def test_the_blocks_norm_runs_inside_the_kernel():
    """A Wan layer given the block's norm (``pre``) instead of its normed input: with fused
    projections self-attention's q, k and v come from one three-output kernel (the norm
    inside it) and the cross-attention's query from another; each layer equals XLA's
    projections, and XLA's own path equals the layer fed the normed input (the same ops)."""
    from flax import nnx

    from ditax.attention import resolve
    from ditax.models.wan.attention import WanAttention
    from ditax.models.wan.config import WanConfig
    from ditax.nn.head_projection import pre_norm
    from ditax.parallel.platform import Platform
    from ditax.parallel.sharding import ShardingContext

    cfg = WanConfig(num_attention_heads=2, attention_head_dim=128, dtype="bfloat16",
                    param_dtype="float32")
    xr, mul, add = _pre_inputs(41, b=1, length=256)
    ks = jax.random.split(jax.random.key(42), 3)
    cos, sin = (jnp.asarray(t) for t in pair_tables(np.asarray(
        jax.random.uniform(ks[0], (256, 64), maxval=6.0))))
    text = jax.random.normal(ks[1], (1, 24, 256)).astype(jnp.bfloat16)
    affine = (1 + 0.2 * jax.random.normal(ks[2], (256,)), 0.1 * jnp.ones((256,)), 1e-6)
    call = resolve("splash", dict(block_q=128, block_kv=128), platform=Platform("cpu"))
    none = ShardingContext()
    outs, kernels = {}, {}
    for mode in ("fused", "xla"):
        c = dataclasses.replace(cfg, projections=mode)
        sa, ca = WanAttention(c, rngs=nnx.Rngs(1)), WanAttention(c, rngs=nnx.Rngs(2))
        self_pre = lambda x: sa(x, None, call, none, rope=(cos, sin),  # noqa: E731
                                pre=(mul, add, 1e-6))
        outs[mode] = [np.asarray(o, np.float32) for o in (
            self_pre(xr), ca(xr, text, call, none, pre=affine),
            sa(pre_norm(xr, mul, add, 1e-6), None, call, none, rope=(cos, sin)))]
        kernels[mode] = _pallas_outputs(jax.make_jaxpr(self_pre)(xr).jaxpr)
    assert rel_err(outs["fused"][0], outs["xla"][0]) <= 1e-2
    assert rel_err(outs["fused"][1], outs["xla"][1]) <= 1e-2
    np.testing.assert_array_equal(outs["xla"][0], outs["xla"][2])
    assert 3 in kernels["fused"] and 3 not in kernels["xla"], kernels


@pytest.mark.slow   # the kernel's own transposed test is in the fast tier
def test_wan_layer_hands_the_kernels_its_hidden_state_transposed(monkeypatch):
    """``head_projection.TRANSPOSED_INPUT``: a Wan layer's fused self- and cross-attention
    given the block's norm read the hidden state as ``[B, D, L]`` — the rows-major output
    within bfloat16 rounding (the norm's sums in another order)."""
    from flax import nnx

    from ditax.attention import resolve
    from ditax.models.wan.attention import WanAttention
    from ditax.models.wan.config import WanConfig
    from ditax.nn import head_projection
    from ditax.parallel.platform import Platform
    from ditax.parallel.sharding import ShardingContext

    cfg = WanConfig(num_attention_heads=2, attention_head_dim=128, dtype="bfloat16",
                    param_dtype="float32", projections="fused")
    xr, mul, add = _pre_inputs(61, b=1, length=256)
    cos, sin = (jnp.asarray(t) for t in pair_tables(np.asarray(
        jax.random.uniform(jax.random.key(62), (256, 64), maxval=6.0))))
    text = jax.random.normal(jax.random.key(63), (1, 24, 256)).astype(jnp.bfloat16)
    call = resolve("splash", dict(block_q=128, block_kv=128), platform=Platform("cpu"))
    sa, ca = WanAttention(cfg, rngs=nnx.Rngs(1)), WanAttention(cfg, rngs=nnx.Rngs(2))
    outs = {}
    for t in (False, True):
        monkeypatch.setattr(head_projection, "TRANSPOSED_INPUT", t)
        outs[t] = [np.asarray(o, np.float32) for o in (
            sa(xr, None, call, ShardingContext(), rope=(cos, sin), pre=(mul, add, 1e-6)),
            ca(xr, text, call, ShardingContext(), pre=(mul[0, 0], add[0, 0], 1e-6)))]
    for a, b in zip(outs[True], outs[False]):
        assert rel_err(a, b) <= 2e-3, rel_err(a, b)
    assert rel_err(outs[True][0], outs[True][1]) > 0.1      # two different layers
