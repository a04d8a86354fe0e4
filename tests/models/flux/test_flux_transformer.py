"""Flux transformer: parity with diffusers (forward and gradient; scanned, and unrolled under
remat), folders, block ranges, presets at full size (headers only), bad configs and inputs."""

import json
import shutil

import jax
import numpy as np
import pytest
import torch
from flax import nnx

import ditax
from ditax.errors import ConfigError, ModelNotFound, RequestError, WeightError
from ditax.io.convert import check_weights, export, param_shapes
from ditax.models.flux.build import abstract_model
from ditax.models.flux.config import FluxConfig
from ditax.models.flux.convert import weight_table
from ditax.parallel import make_mesh
from flux_reference import DEV, TINY, flux_inputs, make_diffusers_flux, run_diffusers_flux
from shared_inputs import output_and_grads
from wan_reference import rel_err

GRAD_INPUTS = ("hidden_states", "encoder_hidden_states", "pooled_projections")


@pytest.mark.parametrize("config,shape,numerics", [
    # diffusers' test config; scanned stacks under the presets' save_proj_out remat policy
    # (named saves: the output projections only)
    (TINY, dict(), dict(remat="save_proj_out")),
    # guidance, 2 + 2 blocks, odd T; unrolled blocks under full remat
    (DEV, dict(text=5, image=12, guidance=True), dict(scan_layers=False, remat="full")),
], ids=["tiny", "dev-unrolled-remat"])
def test_forward_and_gradient_match_diffusers(tmp_path, rng, fast_compile, config, shape,
                                              numerics):
    """The loaded model's output and its gradient (w.r.t. the inputs and every parameter, in
    diffusers' keys and layouts) against torch autograd, from one compiled program: scanned
    stacks (the default) under save_proj_out remat and unrolled ones under full remat alike."""
    m, folder = make_diffusers_flux(tmp_path, **config)
    inputs = flux_inputs(rng, config, **shape)
    tr = ditax.load_transformer(folder, **numerics)
    ref = run_diffusers_flux(m, inputs)
    ct = rng.standard_normal(ref.shape).astype(np.float32)

    out, grads = output_and_grads(tr, inputs, GRAD_INPUTS, ct)
    assert out.shape == ref.shape and rel_err(out, ref) <= 1e-5, rel_err(out, ref)

    leaves = {k: torch.from_numpy(v).requires_grad_(k in GRAD_INPUTS) for k, v in inputs.items()}
    (m(**leaves, return_dict=False)[0] * torch.from_numpy(ct)).sum().backward()
    for name, g in zip(GRAD_INPUTS, grads[1:]):
        assert rel_err(g, leaves[name].grad.numpy()) <= 1e-5, name
    ours = export(weight_table(tr.config), grads[0]._state)     # diffusers keys and layouts
    theirs = {k: p.grad.numpy() for k, p in m.named_parameters()}
    assert set(ours) == set(theirs)
    errs = {k: rel_err(ours[k], theirs[k]) for k in theirs}
    assert max(errs.values()) <= 1e-5, {k: e for k, e in errs.items() if e > 1e-5}


def test_pipeline_folder_with_a_sharded_index(tmp_path):
    """A pipeline folder's transformer/ saved as shards + index loads every tensor as saved."""
    m, _ = make_diffusers_flux(tmp_path, **TINY)
    pipe = tmp_path / "pipe"
    m.save_pretrained(pipe / "transformer", max_shard_size="20KB")
    assert list((pipe / "transformer").glob("*.index.json")), "expected a sharded save"
    tr = ditax.load_transformer(pipe)
    assert type(tr).__name__ == "FluxTransformerModel" and tr.config.num_single_layers == 1
    ours = export(weight_table(tr.config), tr._state)
    theirs = {k: v.numpy() for k, v in m.state_dict().items()}
    assert set(ours) == set(theirs)
    for k, v in theirs.items():
        np.testing.assert_array_equal(ours[k], v, err_msg=k)


def test_block_ranges_give_the_whole_forward(tmp_path, rng, fast_compile):
    """The blocks run in pieces — sub-ranges of a stack and across the double / single stacks,
    as a step cache runs them — give the whole forward, scanned and unrolled alike."""
    _, folder = make_diffusers_flux(tmp_path, **DEV)
    inputs = flux_inputs(rng, DEV, text=5, image=12, guidance=True)
    x = inputs.pop("hidden_states")
    t, text = inputs.pop("timestep"), inputs.pop("encoder_hidden_states")
    models = [ditax.load_transformer(folder, scan_layers=scan).module for scan in (True, False)]
    assert [m.block_stacks for m in models] == [(("transformer_blocks", 2),
                                                 ("single_transformer_blocks", 2))] * 2

    @jax.jit
    def run(models):
        out = []
        for mod in models:
            h0, ctx = mod.embed(x, t, text, **inputs)
            h = h0
            for a, b in ((0, 1), (1, 3), (3, 3), (3, 4)):    # double | both | none | single
                h = mod.run_blocks(h, ctx, a, b)
            out += [mod.head(h, ctx), mod.head(mod.run_blocks(h0, ctx), ctx)]
        return out

    pieces, whole, pieces_unrolled, whole_unrolled = run(models)
    np.testing.assert_allclose(pieces, whole, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(pieces_unrolled, whole, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(whole_unrolled, whole, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"blocks 2..5 outside 0..4"):
        models[0].run_blocks(None, None, 2, 5)


def test_full_size_tables_match_diffusers_keys_and_shapes():
    """FLUX.1-dev and -schnell (the presets) have exactly diffusers' keys and shapes (a meta
    model's state dict against the table, headers only) and dev's 11.9 B parameters."""
    from diffusers import FluxTransformer2DModel

    from ditax.config import load_config
    from ditax.models.flux.config import DIFFUSERS_FIELDS

    class Header:
        def __init__(self, sd):
            self.sd = sd

        def keys(self):
            return self.sd.keys()

        def shape(self, key):
            return tuple(self.sd[key].shape)

    for name, guidance in (("flux.1-dev", True), ("flux.1-schnell", False)):
        cfg = load_config(name).model
        assert (cfg.guidance_embeds, cfg.num_layers, cfg.num_single_layers) == (guidance, 19, 38)
        assert (cfg.num_attention_heads, cfg.attention_head_dim, cfg.joint_attention_dim,
                cfg.pooled_projection_dim, cfg.axes_dims_rope) == (24, 128, 4096, 768,
                                                                   (16, 56, 56))
        with torch.device("meta"):
            ref = FluxTransformer2DModel(**{f: getattr(cfg, f) for f in DIFFUSERS_FIELDS})
        shapes = param_shapes(nnx.state(abstract_model(cfg)))
        check_weights(weight_table(cfg), Header(ref.state_dict()), shapes)
        n = sum(int(np.prod(s)) for s in shapes.values())
        assert n == sum(p.numel() for p in ref.parameters())
        assert n == (11_901_408_320 if guidance else 11_891_178_560)


def test_bad_configs_weights_and_inputs_give_one_clear_line(tmp_path, rng):
    _, folder = make_diffusers_flux(tmp_path, **TINY)
    cfg_path = folder / "config.json"
    good = json.loads(cfg_path.read_text())

    def with_config(name, **change):
        bad = tmp_path / name
        shutil.copytree(folder, bad)
        (bad / "config.json").write_text(json.dumps({**good, **change}))
        return bad

    with pytest.raises(ConfigError, match=r"axes_dims_rope=\[4, 4, 6\] sums to 14; .* "
                                          r"attention_head_dim=16"):
        ditax.load_transformer(with_config("axes", axes_dims_rope=[4, 4, 6]))
    with pytest.raises(ConfigError, match=r"axes_dims_rope=\[5, 3, 8\] must be even"):
        ditax.load_transformer(with_config("odd", axes_dims_rope=[5, 3, 8]))
    with pytest.raises(ConfigError, match=r"model.num_single_layers=0 must be an integer >= 1"):
        ditax.load_transformer(with_config("zero", num_single_layers=0))
    with pytest.raises(WeightError, match=r"missing \d+ key\(s\): single_transformer_blocks\.1\."):
        ditax.load_transformer(with_config("deeper", num_single_layers=2))
    with pytest.raises(WeightError, match=r"missing \d+ key\(s\): time_text_embed\.guidance_"):
        ditax.load_transformer(with_config("guided", guidance_embeds=True))
    with pytest.raises(ConfigError, match=r"is a WanTransformer3DModel, not a Flux"):
        from ditax.models.flux.loading import load_transformer

        load_transformer(with_config("wan", _class_name="WanTransformer3DModel"))
    with pytest.raises(ConfigError, match=r"remat='some' is not one of"):
        ditax.load_transformer(folder, remat="some")
    with pytest.raises(ConfigError, match=r"scan_layer=False is no FluxConfig field; did you "
                                          r"mean 'scan_layers'"):
        ditax.load_transformer(folder, scan_layer=False)
    with pytest.raises(ConfigError, match=r"num_attention_heads=2 is not divisible by "
                                          r"mesh.tensor=4"):
        ditax.load_transformer(folder, mesh=make_mesh({"tensor": 4, "fsdp": 2}))
    with pytest.raises(ModelNotFound):
        ditax.load_transformer(tmp_path / "nope")

    from safetensors.torch import load_file, save_file

    wrong = tmp_path / "wrong"
    shutil.copytree(folder, wrong)
    f = next(wrong.glob("*.safetensors"))
    sd = load_file(f)
    sd["single_transformer_blocks.0.proj_out.weight"] = torch.zeros(32, 128)
    save_file(sd, f)
    with pytest.raises(WeightError, match=r"single_transformer_blocks\.0\.proj_out\.weight: "
                                          r"shape \(32, 128\) but the model expects \(32, 160\)"):
        ditax.load_transformer(wrong)

    tr = ditax.load_transformer(folder)
    x = flux_inputs(rng, TINY)
    cases = [
        (dict(hidden_states=x["hidden_states"][..., :3]), r"hidden_states must be packed tokens "
                                                          r"\[B, L, in_channels=4\]; got shape "
                                                          r"\(2, 16, 3\)"),
        (dict(encoder_hidden_states=x["encoder_hidden_states"][:1]),
         r"encoder_hidden_states must be \[B=2, T, joint_attention_dim=32\]"),
        (dict(pooled_projections=x["pooled_projections"][:, :5]),
         r"pooled_projections must be \[B=2, pooled_projection_dim=32\]"),
        (dict(img_ids=x["img_ids"][None]), r"img_ids must be \[16, 3\] .*pass ids\[0\]"),
        (dict(txt_ids=x["txt_ids"][:, :2]), r"txt_ids must be \[7, 3\]"),
        (dict(timestep=np.ones((2, 2), np.float32)), r"timestep must be a scalar or \[B=2\]"),
        (dict(guidance=np.ones(2, np.float32)), r"no guidance embedding .*pass guidance=None"),
        (dict(text_mask=np.ones((2, 6), bool)), r"text_mask must be \[B, T\] = \(2, 7\)"),
    ]
    for change, msg in cases:
        with pytest.raises(RequestError, match=msg):
            tr(**{**x, **change})
    _, dev = make_diffusers_flux(tmp_path, **DEV)
    with pytest.raises(RequestError, match=r"guidance=None, but this model embeds"):
        ditax.load_transformer(dev)(**flux_inputs(rng, DEV))
    with pytest.raises(ConfigError, match=r"batch=2 is not divisible"):
        ditax.load_transformer(folder, mesh=make_mesh({"fsdp": 8}))(**x)


def test_rope_tables_match_diffusers(rng):
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    from ditax.models.flux.embeddings import rope_cos_sin

    ids = np.concatenate([np.zeros((5, 3)), np.stack(np.meshgrid(
        [0.0], np.arange(6.0), np.arange(7.0), indexing="ij"), -1).reshape(-1, 3),
        rng.standard_normal((9, 3)) * 30]).astype(np.float32)
    cos_r, sin_r = FluxPosEmbed(10000, [16, 56, 56])(torch.from_numpy(ids))
    cos, sin = rope_cos_sin(ids, (16, 56, 56))
    # float32 angles against diffusers' float64 ones: |id| * 2^-23 at most (ids up to ~100)
    np.testing.assert_allclose(np.asarray(cos), cos_r.numpy(), atol=2e-5)
    np.testing.assert_allclose(np.asarray(sin), sin_r.numpy(), atol=2e-5)
    small = np.abs(ids).max(1) <= 8
    np.testing.assert_allclose(np.asarray(cos)[small], cos_r.numpy()[small], atol=1e-6)


def test_family_shapes_flops_and_init_from_checks(tmp_path):
    """The family as training and planning see it: latent grid and tokens of an image, model
    FLOPs (FLUX.1-dev at 1024² with 512 text tokens: 223 TFLOP per sample forward + backward,
    maxdiffusion's 446 per chip at 2 samples), and an init_from folder of another
    architecture refused naming the fields to change."""
    from ditax.config import load_config
    from ditax.models.base import model_family

    family = model_family(load_config("flux.1-dev").model)
    assert family.name == "flux" and family.latent_channels == 16 and family.text_dim == 4096
    assert family.latent_shape(1, 1024, 768) == (16, 1, 128, 96)
    assert family.tokens_per_sample((16, 1, 128, 128)) == 4096
    assert family.flops_per_sample((16, 1, 128, 128), 512) / 1e12 == pytest.approx(223.2, abs=0.1)
    with pytest.raises(ConfigError, match=r"1000x1024 must be multiples of 16"):
        family.latent_grid(1, 1000, 1024)
    # the presets' save_proj_out runs all of the blocks' forward again but their output
    # projections: more than save_proj (which keeps the double blocks' inputs too), less
    # than full
    lat = (16, 1, 128, 128)
    again = {r: model_family(load_config("flux.1-dev", [f"model.remat={r}"]).model)
             .recompute_flops_per_sample(lat, 512) / 1e12
             for r in ("save_proj", "save_proj_out", "full")}
    assert again["save_proj"] < again["save_proj_out"] < again["full"], again
    assert again["save_proj_out"] == pytest.approx(again["full"] - 24.8, abs=0.05), again
    _, folder = make_diffusers_flux(tmp_path, **TINY)
    with pytest.raises(ConfigError, match=r"init_from=.*num_layers: config 19 vs folder 1, .*"
                                          r"pass model.in_channels=4 model.num_layers=1 "):
        family.weights_folder(folder)
    tiny = model_family(FluxConfig.from_diffusers(json.loads((folder / "config.json")
                                                             .read_text())))
    assert tiny.weights_folder(folder) == folder
    assert "OK — 1 double + 1 single blocks, D=32, 2 heads x 16" in tiny.check_folder(folder)


def test_int8_activations_join_the_single_blocks_parts(tmp_path, rng, monkeypatch):
    """int8 weights x int8 activations: each single block's ``proj_out`` reads the attention
    output and the MLP quantized part by part (:meth:`QuantSpec.quantize_parts`), bit for bit
    the output of the concatenation quantized whole (``joined_input`` patched back to it)."""
    from quant_parts_reference import parts_output_equals_joined

    m, folder = make_diffusers_flux(tmp_path, **TINY)
    inputs = flux_inputs(rng, TINY)
    tr = ditax.load_transformer(folder, quantize="int8", quantize_activations=True)
    new = parts_output_equals_joined(monkeypatch, tr, inputs)
    assert 1e-6 < rel_err(new, run_diffusers_flux(m, inputs)) < 5e-2
