"""Per-row LoRA strengths (:func:`ditax.lora.unmerged.row_strengths`): the rows of one batch
run with their own strength vectors, in one forward.

Small random Wan (2 layers, 2 heads x 16) and Flux (two double, two single blocks, guidance
embedding) transformers, two random LoRAs attached unmerged on every Linear layer of the
model's table (the first with bias deltas on every other layer, the second on every other
layer; ranks 4 and 3). A batch of rows with strengths ``S`` (one forward, and classifier-free
guidance batched: ``[cond rows, uncond rows]``, ``Bf = 2B``) must equal each row run alone
with :func:`set_strengths` to its vector, within float32 rounding (``TOL`` of the output's
largest value; measured ~4e-7). Also: Wan's per-token timesteps (its time embedder reads
``[Bf·L, ...]``), an 8-device mesh with the batch split (data 2 x fsdp 4), an int8 base
(the loader's ``quantize="int8"``), every view of the layer (column chunks, head-major,
from heads) and that shared ``[J]`` strengths compute what they did before.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.io.convert import param_shapes
from ditax.lora.merge import upstream_shapes
from ditax.lora.table import parse_lora
from ditax.lora.unmerged import (LoraLinear, _by_module, attach, lora_count, row_strengths,
                                 set_strengths)
from ditax.nn import Linear

#: rows' strengths for the two LoRAs (B = 3); the mesh test adds a fourth row
S = np.array([[1.0, 0.0], [0.0, 0.7], [0.5, -1.0]], np.float32)
TOL = 1e-5


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def lora_tensors(module, table, seed=0) -> list[dict]:
    """Two random PEFT-format LoRA files' tensors over every Linear layer of ``table`` (module
    docstring)."""
    shapes = upstream_shapes(table, param_shapes(nnx.state(module, nnx.Param)))
    linears = sorted(k[:-len(".weight")] for k, v in _by_module(table).items()
                     if v[2] == "kernel")
    gen = np.random.default_rng(seed)
    out = []
    for j, (rank, mods) in enumerate(((4, linears), (3, linears[1::2]))):
        t = {}
        for i, name in enumerate(mods):
            dout, din = shapes[name + ".weight"]
            a = 0.5 / (rank * din) ** 0.25
            t[f"transformer.{name}.lora_A.weight"] = (
                a * gen.standard_normal((rank, din))).astype(np.float32)
            t[f"transformer.{name}.lora_B.weight"] = (
                a * gen.standard_normal((dout, rank))).astype(np.float32)
            if j == 0 and i % 2 and name + ".bias" in shapes:
                t[f"transformer.{name}.lora_B.bias"] = (
                    0.1 * gen.standard_normal(dout)).astype(np.float32)
        out.append(t)
    return out


def random_loras(module, table, names, seed=0):
    """:func:`lora_tensors` parsed, at strength 0."""
    return [(parse_lora(t, names=names), 0.0) for t in lora_tensors(module, table, seed)]


def random_model(cls, cfg, mesh=None, like=None, shardings=None):
    """``cls(cfg)`` with every parameter drawn ``0.2 · N(0, 1)`` (no compile); with ``mesh``,
    ``like``'s values placed by ``shardings(abstract state, cfg, mesh)``."""
    m = nnx.eval_shape(lambda: cls(cfg, None, mesh, rngs=nnx.Rngs(0)))
    state = nnx.state(m)
    if like is None:
        gen = np.random.default_rng(0)
        nnx.replace_by_pure_dict(state, jax.tree.map(
            lambda a: jnp.asarray(0.2 * gen.standard_normal(a.shape), a.dtype),
            nnx.to_pure_dict(state)))
    else:
        values = nnx.state(like, nnx.Param)
        state = jax.device_put(values, shardings(values, cfg, mesh))
    nnx.update(m, state)
    return m


def _forward(gdef, state, s, batch, args, kw):
    m = nnx.merge(gdef, state)
    if s is not None:
        row_strengths(m, s, batch)     # what a sampling step does before its forward
    return m(*args, **kw)


forward = jax.jit(_forward, static_argnums=(0, 3))


class Attached:
    """A module with LoRAs attached: ``rows(s, batch, *args)`` one jitted forward with
    per-row strengths; ``alone(s_i, *args)`` the forward with shared strengths ``s_i``."""

    def __init__(self, module, **kw):
        self.module, self.kw = module, kw
        self.gdef = nnx.graphdef(module)

    def rows(self, s, batch, *args, kw=None):
        return np.asarray(forward(self.gdef, nnx.state(self.module), jnp.asarray(s), batch,
                                  args, kw or self.kw))

    def alone(self, s, *args, kw=None):
        set_strengths(self.module, s)
        assert nnx.graphdef(self.module) == self.gdef       # values only: no recompile
        return np.asarray(forward(self.gdef, nnx.state(self.module), None, None, args,
                                  kw or self.kw))


def _wan_parts():
    from ditax.models.wan.config import WanConfig
    from ditax.models.wan.convert import config_weight_table
    from ditax.models.wan.lora_names import LORA_NAMES
    from ditax.models.wan.transformer import WanTransformer
    from quant_folders import WAN

    cfg = WanConfig(**WAN)
    return cfg, WanTransformer, config_weight_table(cfg), LORA_NAMES


@pytest.fixture(scope="module")
def wan():
    cfg, cls, table, names = _wan_parts()
    m = random_model(cls, cfg)
    loras = random_loras(m, table, names)
    assert attach(m, loras, table, names=names) > 8 and lora_count(m) == 2
    return Attached(m)


def wan_inputs(gen, b, per_token=False):
    """latents [b, 4, 2, 8, 8] (32 tokens), t [b] or per token [b, 32], text [b, 7, 32]."""
    x = gen.standard_normal((b, 4, 2, 8, 8)).astype(np.float32)
    t = gen.uniform(0, 1000, (b, 32) if per_token else (b,)).astype(np.float32)
    return x, t, gen.standard_normal((b, 7, 32)).astype(np.float32)


def test_wan_rows_of_one_forward_equal_each_row_alone(wan):
    x, t, c = wan_inputs(np.random.default_rng(0), 3)
    y = wan.rows(S, 3, x, t, c)
    ref = np.concatenate([wan.alone(S[i], x[i:i + 1], t[i:i + 1], c[i:i + 1]) for i in range(3)])
    zero = np.concatenate([wan.alone([0, 0], x[i:i + 1], t[i:i + 1], c[i:i + 1])
                           for i in range(3)])
    assert rel(y, ref) < TOL, rel(y, ref)
    assert rel(ref, zero) > 0.1                   # the LoRAs change every row ...
    assert rel(y[1:], ref[:1]) > 0.1              # ... and rows differ (a wrong row shows)
    assert rel(wan.rows(np.zeros((3, 2), np.float32), 3, x, t, c), zero) < TOL


def test_wan_cfg_batched_with_per_token_timesteps(wan):
    """``[cond rows, uncond rows]`` (Bf = 2B: the strengths tiled) with per-token timesteps
    ``[Bf, L]``: the time embedder and its projection read ``[Bf·L, ...]`` (each row's L
    tokens after one another), the blocks ``[Bf, L, D]``."""
    x, t, c = wan_inputs(np.random.default_rng(1), 3, per_token=True)
    u = np.random.default_rng(2).standard_normal(c.shape).astype(np.float32)
    y = wan.rows(S, 6, np.concatenate([x, x]), np.concatenate([t, t]), np.concatenate([c, u]))
    ref = np.concatenate([wan.alone(S[i], x[i:i + 1], t[i:i + 1], text[i:i + 1])
                          for text in (c, u) for i in range(3)])
    assert rel(y, ref) < TOL, rel(y, ref)
    assert rel(ref[3:], ref[:3]) > 0.1            # cond and uncond differ


def test_wan_on_a_mesh_with_the_batch_split(wan):
    """data 2 x fsdp 4 (batch over 8 devices, parameters over fsdp), B = 4 rows, CFG batched
    (8 rows); ``s`` a replicated argument of the jitted step."""
    from ditax.models.wan.build import param_shardings
    from ditax.parallel.mesh import make_mesh

    cfg, cls, table, names = _wan_parts()
    mesh = make_mesh(dict(data=2, fsdp=4))
    m = random_model(cls, cfg, mesh, like=wan.module, shardings=param_shardings)
    assert len(m.blocks.ffn.proj_in.kernel[...].sharding.device_set) == 8
    attach(m, random_loras(m, table, names), table, mesh, names=names)
    s = np.concatenate([S, [[0.3, 0.3]]]).astype(np.float32)
    x, t, c = wan_inputs(np.random.default_rng(3), 4)
    u = np.random.default_rng(4).standard_normal(c.shape).astype(np.float32)
    put = m.sharding.put_batch
    args = [put(jnp.asarray(a)) for a in (np.concatenate([x, x]), np.concatenate([t, t]),
                                          np.concatenate([c, u]))]
    out = forward(nnx.graphdef(m), nnx.state(m), jnp.asarray(s), 8, args, {})
    assert len(out.sharding.device_set) == 8
    ref = np.concatenate([wan.alone(s[i], x[i:i + 1], t[i:i + 1], text[i:i + 1])
                          for text in (c, u) for i in range(4)])
    assert rel(out, ref) < TOL, rel(out, ref)


@pytest.fixture(scope="module")
def flux():
    from ditax.models.flux.config import FluxConfig
    from ditax.models.flux.convert import weight_table
    from ditax.models.flux.lora_names import LORA_NAMES
    from ditax.models.flux.transformer import FluxTransformer
    from flux_reference import DEV

    cfg = FluxConfig(**{**DEV, "axes_dims_rope": tuple(DEV["axes_dims_rope"])})
    m = random_model(FluxTransformer, cfg)
    table = weight_table(cfg)
    assert attach(m, random_loras(m, table, LORA_NAMES, seed=1), table,
                  names=LORA_NAMES) > 8
    return Attached(m)


def test_flux_cfg_batched_rows_equal_each_row_alone(flux):
    """Flux (true CFG: a negative prompt's rows after the prompts'): modulations from
    ``temb [Bf, D]``, image / text / joint tokens ``[Bf, S, D]``."""
    from flux_reference import DEV, flux_inputs

    gen = np.random.default_rng(5)
    p, n = (flux_inputs(gen, DEV, b=3, text=5, guidance=True) for _ in range(2))
    n = {**p, "encoder_hidden_states": n["encoder_hidden_states"],
         "pooled_projections": n["pooled_projections"]}

    def call(d, rows):
        return ((d["hidden_states"][rows], d["timestep"][rows], d["encoder_hidden_states"][rows]),
                dict(pooled_projections=d["pooled_projections"][rows], img_ids=d["img_ids"],
                     txt_ids=d["txt_ids"], guidance=d["guidance"][rows]))

    (xp, tp, cp), kp = call(p, slice(None))
    (_, _, cn), kn = call(n, slice(None))
    both = {k: np.concatenate([kp[k], kn[k]]) if k in ("pooled_projections", "guidance")
            else kp[k] for k in kp}
    y = flux.rows(S, 6, np.concatenate([xp, xp]), np.concatenate([tp, tp]),
                  np.concatenate([cp, cn]), kw=both)
    ref = np.concatenate([flux.alone(S[i], *call(d, slice(i, i + 1))[0],
                                     kw=call(d, slice(i, i + 1))[1])
                          for d in (p, n) for i in range(3)])
    zero = np.concatenate([flux.alone([0, 0], *call(p, slice(i, i + 1))[0],
                                      kw=call(p, slice(i, i + 1))[1]) for i in range(3)])
    assert rel(y, ref) < TOL, rel(y, ref)
    assert rel(ref[:3], zero) > 0.1 and rel(ref[3:], ref[:3]) > 0.01


def test_int8_base_from_the_loader(tmp_path, wan):
    """``quantize="int8"``, LoRAs unmerged over the 8-bit kernels: per-row equals alone."""
    from safetensors.numpy import save_file

    import ditax
    from quant_folders import write_wan_folder

    folder = write_wan_folder(tmp_path / "wan")
    table = _wan_parts()[2]
    files = [(str(tmp_path / f"l{j}.safetensors"), 0.0)
             for j in range(2)]
    for (path, _), tensors in zip(files, lora_tensors(wan.module, table, seed=2)):
        save_file(tensors, path)
    tr = ditax.load_transformer(folder, quantize="int8", loras=files, lora_mode="unmerged")
    q = tr.module.blocks.ffn.proj_in
    assert isinstance(q, LoraLinear) and q.kernel[...].dtype == jnp.int8
    model = Attached(tr.module)
    x, t, c = wan_inputs(np.random.default_rng(6), 3)
    y = model.rows(S, 3, x, t, c)
    ref = np.concatenate([model.alone(S[i], x[i:i + 1], t[i:i + 1], c[i:i + 1])
                          for i in range(3)])
    assert rel(y, ref) < TOL, rel(y, ref)
    assert rel(ref[1:], ref[:1]) > 0.1


# ---------------------------------------------------------------------------------------------
# one layer: every way a model calls it


def _layer(rng, int8=False, out_heads=None, bias=True):
    """A LoraLinear (D = 16 → 16, two LoRAs of ranks 2 and 1, bias deltas) on a random base."""
    from ditax.nn.quant import quantize_linear

    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    base = Linear(16, 16, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0),
                  out_heads=out_heads)
    base.bias[...] = f(16)
    if int8:
        quantize_linear(base, "int8")
    return LoraLinear(base, f(3, 16), f(3, 16), jnp.asarray([0.5, 0.5, 2.0]), (0, 0, 1),
                      f(2, 16) if bias else None, jnp.asarray([0.0, 0.0]))


VIEWS = {   # name → (x's shape for B rows, the call)
    "call": ((5, 16), lambda m, x: m(x)),
    "call 2-D": ((16,), lambda m, x: m(x)),
    "out_columns": ((5, 16), lambda m, x: m.out_columns(m.column_input(x), 4, 8)),
    "from_heads": ((5, 4, 4), lambda m, x: m.from_heads(x)),
    "to_head_major": ((5, 16), lambda m, x: m.to_head_major(x, 4)),
    "from_head_major": ((4, 5, 4), lambda m, x: m.from_head_major(x)),
}


@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("view", VIEWS)
def test_every_view_of_the_layer_per_row(rng, view, int8):
    """Rows ``[cond_1..3, uncond_1..3]`` (Bf = 6) with per-row strengths equal each row alone;
    ``call 2-D``: ``x [Bf·M, in]``, an inner axis (M = 2) folded into the batch."""
    shape, call = VIEWS[view]
    m = _layer(rng, int8, out_heads=4 if view == "to_head_major" else None)
    b = 6 * 2 if view == "call 2-D" else 6
    x = jnp.asarray(rng.standard_normal((b,) + shape), jnp.float32)
    row_strengths(m, S, 6)
    y = np.asarray(call(m, x))
    step = b // 6
    ref = []
    for r in range(6):
        set_strengths(m, S[r % 3])
        ref.append(np.asarray(call(m, x[r * step:(r + 1) * step])))
    assert rel(y, np.concatenate(ref)) < TOL, rel(y, np.concatenate(ref))
    set_strengths(m, [0, 0])
    assert rel(y, call(m, x)) > 0.1


def _old_delta(m, x):
    """The LoRA terms as :class:`LoraLinear` computed them before per-row strengths."""
    dt = m.dtype
    s = m.lora_strength[...].astype(dt)
    g = m.lora_scale[...].astype(dt) * jnp.take(s, jnp.asarray(m.lora_owner), -1)
    h = jnp.einsum("...i,ri->...r", x.astype(dt), m.lora_down[...].astype(dt))
    y = jnp.zeros((), dt) + jnp.einsum("...r,ro->...o", h * g, m.lora_up[...].astype(dt))
    return y + jnp.einsum("j,jo->o", s, m.lora_bias[...].astype(dt))


def test_shared_strengths_compute_what_they_did(rng):
    """Shared ``[J]`` strengths: bit for bit the earlier formula, eager and jitted; after an
    eager :func:`row_strengths`, :func:`set_strengths` restores the shapes and graph (so a
    compiled program is reused) and the same values."""
    m = _layer(rng)
    x = jnp.asarray(rng.standard_normal((3, 5, 16)), jnp.float32)
    set_strengths(m, [0.8, -0.4])
    old = jax.jit(lambda x: Linear.__call__(m, x) + _old_delta(m, x))(x)
    gdef, state = nnx.split(m)
    run = jax.jit(lambda st, x: nnx.merge(gdef, st)(x))
    new = run(state, x)
    np.testing.assert_array_equal(new, old)
    np.testing.assert_array_equal(m(x), Linear.__call__(m, x) + _old_delta(m, x))
    row_strengths(m, S, 3)
    assert m.lora_strength[...].shape == (3, 2)
    set_strengths(m, [0.8, -0.4])
    gdef2, state2 = nnx.split(m)
    assert gdef2 == gdef and jax.tree.map(jnp.shape, state2) == jax.tree.map(jnp.shape, state)
    np.testing.assert_array_equal(run(state2, x), new)
    assert run._cache_size() == 1


def test_stacked_strengths_and_counts():
    """A stacked layer (scanned blocks) gets ``[L, Bf, J]``; a plain model has no LoRAs."""
    from ditax.nn.stack import make_stack

    rngs = nnx.Rngs(0)
    stack = make_stack(lambda r: Linear(8, 8, dtype=jnp.float32, param_dtype=jnp.float32,
                                        rngs=r), 3, rngs)
    assert lora_count(stack) == 0
    z = jnp.zeros
    lora = LoraLinear(stack, z((3, 2, 8)), z((3, 2, 8)), z((3, 2)), (0, 1), None,
                      jnp.ones((3, 2)))
    assert lora_count(lora) == 2
    row_strengths(lora, S, 6)
    s = np.asarray(lora.lora_strength[...])
    assert s.shape == (3, 6, 2)
    np.testing.assert_array_equal(s[1], np.concatenate([S, S]))
    set_strengths(lora, [0.2, 0.3])
    assert lora.lora_strength[...].shape == (3, 2)


def test_errors_name_the_shapes(rng):
    m = _layer(rng)
    with pytest.raises(ValueError, match=r"batch=4 must be the forward's batch size"):
        row_strengths(m, S, 4)
    with pytest.raises(ValueError, match=r"takes \[B, J\]"):
        row_strengths(m, S[0], 3)
    with pytest.raises(ValueError, match=r"3 strength\(s\) given; the model has 2"):
        row_strengths(m, np.ones((3, 3), np.float32), 3)
    row_strengths(m, S, 6)
    with pytest.raises(ValueError, match=r"layer input of shape \(4, 16\)"):
        m(jnp.ones((4, 16)))
    with pytest.raises(ValueError, match=r"layer input of shape \(16,\)"):
        m(jnp.ones((16,)))
