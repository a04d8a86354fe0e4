"""Wan transformer: parity with diffusers, components, meshes, scan/remat, bad inputs."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import ditax
from ditax.config import AttentionConfig, ConfigError, ModelConfig
from ditax.models.wan import embeddings as E
from ditax.errors import WeightError
from ditax.models.wan.build import init_model
from ditax.nn import apply_rope
from ditax.parallel import make_mesh
from wan_reference import make_diffusers_wan, rel_err, run_diffusers


def _inputs(rng, b=2, c=4, f=3, y=6, x=10, t_len=7, text_dim=32):
    lat = rng.standard_normal((b, c, f, y, x)).astype(np.float32)
    t = rng.uniform(0, 1000, size=(b,)).astype(np.float32)
    text = rng.standard_normal((b, t_len, text_dim)).astype(np.float32)
    return lat, t, text


@pytest.mark.parametrize("kw,shape", [
    (dict(heads=2, head_dim=16, layers=2), dict(f=3, y=6, x=10)),
    (dict(heads=3, head_dim=128, layers=1, ffn=96), dict(f=2, y=4, x=4, t_len=13)),
    (dict(heads=4, head_dim=24, layers=3, cross_attn_norm=False, in_ch=6, out_ch=5),
     dict(c=6, f=1, y=10, x=6, t_len=5)),
    (dict(heads=2, head_dim=32, layers=2, patch=(2, 2, 2)), dict(f=4, y=6, x=6, b=1)),
])
def test_parity_with_diffusers(tmp_path, rng, kw, shape):
    m, folder = make_diffusers_wan(tmp_path, **kw)
    lat, t, text = _inputs(rng, **shape)
    ref = run_diffusers(m, lat, t, text)
    tr = ditax.load_transformer(folder)
    out = np.asarray(tr(lat, t, text))
    assert out.shape == ref.shape
    assert rel_err(out, ref) <= 1e-5, rel_err(out, ref)


def test_pipeline_folder_and_sharded_weights(tmp_path, rng):
    m, folder = make_diffusers_wan(tmp_path)
    pipe = tmp_path / "pipe"
    m.save_pretrained(pipe / "transformer", max_shard_size="20KB")
    assert list((pipe / "transformer").glob("*.index.json")), "expected a sharded save"
    lat, t, text = _inputs(rng)
    out = np.asarray(ditax.load_transformer(pipe)(lat, t, text))
    assert rel_err(out, run_diffusers(m, lat, t, text)) <= 1e-5


def test_rope_matches_diffusers(rng):
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    for k in (16, 30, 128):
        grid = (3, 4, 5)
        ref = WanRotaryPosEmbed(k, (1, 2, 2), 1024)
        cos_r, sin_r = ref(torch.zeros(1, 1, grid[0], 2 * grid[1], 2 * grid[2]))
        cos, sin = E.rope_cos_sin(k, grid)       # [L, K]: diffusers' tables themselves
        np.testing.assert_allclose(np.asarray(cos), cos_r[0, :, 0].numpy(), atol=1e-6)
        np.testing.assert_allclose(np.asarray(sin), sin_r[0, :, 0].numpy(), atol=1e-6)
        x = rng.standard_normal((2, 60, 3, k)).astype(np.float32)
        # the reference rotation (diffusers' processor math) on the same input
        x1, x2 = x[..., 0::2], x[..., 1::2]
        c, s = cos_r[0, :, :, 0::2].numpy(), sin_r[0, :, :, 1::2].numpy()
        want = np.empty_like(x)
        want[..., 0::2] = x1 * c - x2 * s
        want[..., 1::2] = x1 * s + x2 * c
        np.testing.assert_allclose(np.asarray(apply_rope(jnp.asarray(x), cos, sin)), want,
                                   rtol=1e-5, atol=1e-5)


def test_rope_bf16_rotates_in_float32_and_rounds_once(rng):
    """bf16 q/k: the rotation is the float32 pair arithmetic of the reference on the bf16
    values, rounded once to bf16 (as diffusers' ``type_as`` after its float32 math)."""
    k, grid = 128, (2, 3, 4)
    cos, sin = E.rope_cos_sin(k, grid)
    x = jnp.asarray(rng.standard_normal((1, 24, 2, k)), jnp.bfloat16)
    got = jax.jit(apply_rope)(x, cos, sin)
    assert got.dtype == jnp.bfloat16
    xf = np.asarray(x, np.float32)
    c, s = np.asarray(cos)[None, :, None, 0::2], np.asarray(sin)[None, :, None, 0::2]
    want = np.empty_like(xf)
    want[..., 0::2] = xf[..., 0::2] * c - xf[..., 1::2] * s
    want[..., 1::2] = xf[..., 0::2] * s + xf[..., 1::2] * c
    want = np.asarray(jnp.asarray(want).astype(jnp.bfloat16), np.float32)
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)


def test_condition_embedder_and_block_match_diffusers(tmp_path, rng):
    m, folder = make_diffusers_wan(tmp_path, heads=2, head_dim=16, layers=1)
    tr = ditax.load_transformer(folder)
    mod = tr.module
    t = np.array([3.0, 999.0], np.float32)
    text = rng.standard_normal((2, 5, 32)).astype(np.float32)
    with torch.no_grad():
        temb_r, proj_r, text_r, _ = m.condition_embedder(torch.from_numpy(t),
                                                         torch.from_numpy(text))
    # jitted: one program instead of one per eager op
    temb, proj, text_o = nnx.jit(lambda mod, t, c: mod.condition_embedder(t, c))(
        mod, jnp.asarray(t), jnp.asarray(text))
    assert rel_err(temb, temb_r.numpy()) < 1e-6
    assert rel_err(proj, proj_r.numpy().reshape(2, 6, -1)) < 1e-6
    assert rel_err(text_o, text_r.numpy()) < 1e-6

    # one block, fed the same hidden states / modulation / rope
    d = 32
    h = rng.standard_normal((2, 12, d)).astype(np.float32)
    grid = (1, 3, 4)
    cos, sin = E.rope_cos_sin(16, grid)
    rope_r = m.rope(torch.zeros(1, 1, 1, 6, 8))
    with torch.no_grad():
        want = m.blocks[0](torch.from_numpy(h), text_r, proj_r.reshape(2, 6, -1), rope_r).numpy()
    blk_gdef, blk_state = nnx.split(mod.blocks)
    blk = nnx.merge(blk_gdef, jax.tree.map(lambda p: p[0], blk_state))
    got = nnx.jit(lambda blk, h, c, p, cs: blk(h, c, p, cs, None, None, mod.attention_plan,
                                                mod.sharding))(blk, jnp.asarray(h), text_o,
                                                               proj, (cos, sin))
    assert rel_err(got, want) < 1e-5


def test_scan_and_remat_do_not_change_values(rng):
    base = ModelConfig(num_attention_heads=2, attention_head_dim=16, ffn_dim=48, num_layers=2,
                       in_channels=4, out_channels=4, text_dim=24, freq_dim=16)
    lat, t, text = _inputs(rng, text_dim=24)
    outs, grads = [], []
    for scan, remat in [(True, "none"), (False, "full"), (True, "save_dots")]:
        cfg = ModelConfig(**{**base.__dict__, "scan_layers": scan, "remat": remat})
        model = init_model(cfg, seed=3)
        gdef, state = nnx.split(model)

        def loss(st):
            out = nnx.merge(gdef, st)(lat, t, text)
            return jnp.mean(out ** 2), out

        # one program per config: the forward's output is the primal of the gradient's
        (_, out), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
        outs.append(np.asarray(out))
        grads.append(np.asarray(g["blocks"]["attn1"]["to_q"]["kernel"][...]))
    for o, g in zip(outs[1:], grads[1:]):
        np.testing.assert_allclose(o, outs[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g, grads[0], rtol=1e-4, atol=1e-7)


@pytest.fixture(scope="module")
def wan_h4(tmp_path_factory):
    """One random diffusers model (4 heads, 2 layers) for the mesh cases: built and saved once."""
    return make_diffusers_wan(tmp_path_factory.mktemp("wan_h4"), heads=4, head_dim=16, layers=2)


@pytest.fixture(scope="module")
def wan_h8(tmp_path_factory):
    """One random diffusers model (8 heads, 2 layers) for the backend cases: built once."""
    return make_diffusers_wan(tmp_path_factory.mktemp("wan_h8"), heads=8, head_dim=16, layers=2)


@pytest.mark.parametrize("mesh_kw", [
    dict(fsdp=8), dict(context=8), dict(fsdp=2, context=2, tensor=2), dict(data=2, fsdp=4),
])
def test_mesh_equals_single_device(wan_h4, rng, mesh_kw):
    m, folder = wan_h4
    lat, t, text = _inputs(rng, b=8, f=3, y=6, x=10)   # L = 45: padded for context sharding
    single = np.asarray(ditax.load_transformer(folder)(lat, t, text))
    mesh = make_mesh(dict(mesh_kw))
    tr = ditax.load_transformer(folder, mesh=mesh)
    # parameters really are sharded (not replicated) where the mesh allows it
    k = tr.module.blocks.attn1.to_q.kernel[...]
    if mesh_kw.get("fsdp", 1) * mesh_kw.get("context", 1) > 1:
        assert k.sharding.shard_shape(k.shape) != k.shape
    out = np.asarray(tr(lat, t, text))
    assert rel_err(out, single) <= 1e-5


def test_bad_inputs(tmp_path, rng):
    _, folder = make_diffusers_wan(tmp_path, heads=4, head_dim=16, layers=1)
    tr = ditax.load_transformer(folder)
    lat, t, text = _inputs(rng)
    with pytest.raises(ValueError, match=r"rank 5"):
        tr(lat[0], t, text)
    with pytest.raises(ValueError, match=r"height=5 is not divisible by the patch size 2"):
        tr(lat[:, :, :, :5], t, text)
    with pytest.raises(ValueError, match=r"width 31 != model text_dim=32"):
        tr(lat, t, text[..., :31])
    with pytest.raises(ValueError, match=r"3 channels"):
        tr(lat[:, :3], t, text)
    with pytest.raises(ConfigError, match=r"num_attention_heads=4 is not divisible by mesh.tensor=8"):
        ditax.load_transformer(folder, mesh=make_mesh(dict(tensor=8)))
    with pytest.raises(ValueError, match=r"batch=2 is not divisible by mesh.data\*mesh.fsdp = 1\*8 = 8"):
        ditax.load_transformer(folder, mesh=make_mesh(dict(fsdp=8)))(lat, t, text)


def test_broken_weight_folders(tmp_path):
    m, folder = make_diffusers_wan(tmp_path, layers=2)
    from safetensors.torch import load_file, save_file

    wfile = next(folder.glob("*.safetensors"))
    sd = load_file(wfile)

    missing = tmp_path / "missing"
    shutil.copytree(folder, missing)
    sd2 = dict(sd)
    sd2.pop("blocks.1.attn2.to_k.weight")
    sd2["blocks.0.extra.weight"] = torch.zeros(3)
    save_file(sd2, next(missing.glob("*.safetensors")))
    with pytest.raises(WeightError, match=r"missing 1 key\(s\): blocks\.1\.attn2\.to_k\.weight.*"
                                          r"unexpected 1 key\(s\): blocks\.0\.extra\.weight"):
        ditax.load_transformer(missing)

    wrong = tmp_path / "wrong"
    shutil.copytree(folder, wrong)
    sd3 = dict(sd)
    sd3["proj_out.weight"] = torch.zeros(5, 32)
    save_file(sd3, next(wrong.glob("*.safetensors")))
    with pytest.raises(WeightError, match=r"proj_out\.weight: shape \(5, 32\)"):
        ditax.load_transformer(wrong)

    trunc = tmp_path / "trunc"
    shutil.copytree(folder, trunc)
    f = next(trunc.glob("*.safetensors"))
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"truncated"):
        ditax.load_transformer(trunc)

    cfg_bad = tmp_path / "cfg_bad"
    shutil.copytree(folder, cfg_bad)
    c = json.loads((cfg_bad / "config.json").read_text())
    c["num_layers"] = 3
    (cfg_bad / "config.json").write_text(json.dumps(c))
    with pytest.raises(WeightError, match=r"missing .*blocks\.2\."):
        ditax.load_transformer(cfg_bad)

    with pytest.raises(FileNotFoundError, match=r"neither an existing folder nor a hub id"):
        ditax.load_transformer(tmp_path / "nope" / "deeper")


def test_text_mask_reaches_cross_attention(tmp_path, rng):
    """Masking padded text tokens equals running on the unpadded text."""
    _, folder = make_diffusers_wan(tmp_path, layers=1)
    tr = ditax.load_transformer(folder)
    lat, t, text = _inputs(rng, b=1, t_len=9)
    mask = np.zeros((1, 9), bool)
    mask[:, :6] = True
    padded = text.copy()
    padded[:, 6:] = rng.standard_normal((1, 3, 32))
    a = np.asarray(tr(lat, t, padded, text_mask=mask))
    b = np.asarray(tr(lat, t, text[:, :6]))
    assert rel_err(a, b) < 1e-6
    assert rel_err(np.asarray(tr(lat, t, padded)), b) > 1e-4  # without the mask it differs


@pytest.mark.parametrize("mesh_kw,acfg", [
    ({}, AttentionConfig(backend="flash", block_q=16, block_kv=16)),
    ({}, AttentionConfig(backend="splash")),
    ({}, AttentionConfig(backend="blockwise", block_kv=16)),
    ({"context": 8}, AttentionConfig(backend="ulysses", local="xla")),
    ({"context": 4, "fsdp": 2}, AttentionConfig(backend="ulysses", local="flash",
                                                out_a2a="shard_major", block_q=8, block_kv=8)),
    ({"context": 4, "fsdp": 2}, AttentionConfig(backend="ring", local="blockwise", block_kv=8)),
    ({"context": 8}, AttentionConfig(backend="ulysses_ring", local="xla", ulysses_shards=2)),
], ids=["flash", "splash", "blockwise", "ulysses-ctx8", "ulysses-shard_major-ctx4xfsdp2",
        "ring-ctx4xfsdp2", "ulysses_ring-U2"])
def test_attention_backends_in_the_model_match_diffusers(wan_h8, rng, mesh_kw, acfg):
    """Every backend (local and sequence-parallel) keeps diffusers parity (L=45: padded)."""
    m, folder = wan_h8
    lat, t, text = _inputs(rng)
    ref = run_diffusers(m, lat, t, text)
    mesh = make_mesh(dict(mesh_kw)) if mesh_kw else None
    out = np.asarray(ditax.load_transformer(folder, mesh=mesh, attention=acfg)(lat, t, text))
    assert rel_err(out, ref) <= 1e-5, rel_err(out, ref)


def test_model_holds_one_attention_plan():
    """The model builds its attention plan once (config + mesh + heads / head dim / dtype) and
    hands it to the blocks; the target platform decides auto and Pallas interpret mode."""
    from ditax.attention import AttentionPlan
    from ditax.models.wan.build import abstract_model

    cfg = ModelConfig(num_attention_heads=8, attention_head_dim=16, ffn_dim=64, num_layers=1,
                      in_channels=4, out_channels=4, text_dim=16, freq_dim=16)
    mesh = make_mesh({"context": 8})
    m = abstract_model(cfg, AttentionConfig(backend="ulysses", local="flash", block_q=16), mesh)
    plan = m.attention_plan
    assert isinstance(plan, AttentionPlan) and plan.mesh is mesh
    assert plan.self_attn.backend == "ulysses" and plan.cross_attn.backend == "flash"
    assert plan.cross_attn.options.block_q == 16 and plan.cross_attn.options.interpret is True
    assert (plan.num_heads, plan.head_dim, plan.dtype) == (8, 16, "float32")
    with ditax.target_platform("tpu"):
        tpu = abstract_model(cfg, AttentionConfig(backend="auto")).attention_plan
    assert tpu.self_attn.backend == "splash" and tpu.self_attn.options.interpret is False


@pytest.mark.parametrize("backend", ["blockwise", "flash"])
def test_layer_scan_does_not_inflate_attention_backward_memory(backend):
    """Regression: under autodiff of the layer scan, a broadcast mask select inside the
    attention's K/V-block loop was stacked for every block ([blocks, B, N, Lq, bk]) — 250 GiB
    per device for Wan 14B at 720p. The scanned step must need no more temporary memory than
    the unscanned one (compiled from abstract shapes; nothing runs)."""
    from ditax.models.wan.build import abstract_model

    temps = {}
    for scan in (True, False):
        cfg = ModelConfig(num_attention_heads=8, attention_head_dim=16, ffn_dim=64, num_layers=1,
                          in_channels=4, out_channels=4, text_dim=16, freq_dim=16,
                          scan_layers=scan)
        blocks = dict(block_kv=128) if backend == "blockwise" else dict(block_q=128, block_kv=128)
        acfg = AttentionConfig(backend=backend, **blocks)   # blockwise takes no block_q
        gdef, state = nnx.split(abstract_model(cfg, acfg))

        def loss(st, lat, t, text):
            return jnp.mean(nnx.merge(gdef, st)(lat, t, text) ** 2)

        lat = jax.ShapeDtypeStruct((1, 4, 1, 96, 128), jnp.float32)      # 3072 tokens
        t = jax.ShapeDtypeStruct((1,), jnp.float32)
        text = jax.ShapeDtypeStruct((1, 8, 16), jnp.float32)
        ma = jax.jit(jax.grad(loss)).lower(state, lat, t, text).compile().memory_analysis()
        temps[scan] = ma.temp_size_in_bytes
    assert temps[True] <= 1.25 * temps[False], temps
