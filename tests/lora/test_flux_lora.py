"""FLUX.1 LoRAs: diffusers / PEFT, kohya (fused qkv and linear1 split onto their layers; also
kohya keys over diffusers names, ``lora_transformer_``) and XLabs files equal to diffusers' ``FluxPipeline.lora_state_dict`` + ``load_lora_adapter`` +
``fuse_lora`` on a tiny random transformer (two double and three single blocks: stacks of
different depths), merged and unmerged (training and export: test_flux_lora_train.py)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import ditax  # noqa: E402
from ditax.errors import WeightError  # noqa: E402
from ditax.lora import read_lora  # noqa: E402
from ditax.models.flux.lora_names import LORA_NAMES  # noqa: E402
from flux_lora_reference import CFG, D, TOL, diffusers_run, ours, pair, save  # noqa: E402
from flux_lora_reference import base  # noqa: E402,F401  (the module's fixture)
from wan_reference import rel_err  # noqa: E402


def _kohya(rng, top=False):
    """kohya sd-scripts keys: fused qkv on the double blocks (one down, 3D up rows), their
    projections / MLPs / modulations, the single blocks' linear2 and modulation; ``top``:
    instead the single blocks' fused linear1 (q, k, v, MLP rows), the embedders and the final
    layer (adaLN's halves swapped). diffusers' kohya reader takes neither of the latter on a
    tiny model: it fixes FLUX.1-dev's linear1 widths and names the top layers without the
    ``transformer.`` prefix its loader keeps, so those are compared with :func:`_top_as_peft`."""
    t, m = {}, 4 * D

    def put(name, din, dout, r=4, alpha=2.0):
        t[f"lora_unet_{name}.lora_down.weight"], t[f"lora_unet_{name}.lora_up.weight"] = \
            pair(rng, r, din, dout)
        if alpha is not None:
            t[f"lora_unet_{name}.alpha"] = np.asarray(alpha, np.float32)

    if top:
        for i in range(CFG["num_single_layers"]):
            put(f"single_blocks_{i}_linear1", D, 3 * D + m, r=3, alpha=6.0)
        put("img_in", CFG["in_channels"], D)
        put("txt_in", CFG["joint_attention_dim"], D, alpha=None)
        put("time_in_in_layer", 256, D)
        put("guidance_in_out_layer", D, D)
        put("final_layer_adaLN_modulation_1", D, 2 * D, alpha=1.0)
        put("final_layer_linear", D, CFG["in_channels"])
        return t
    for i in range(CFG["num_layers"]):
        for s in ("img", "txt"):
            put(f"double_blocks_{i}_{s}_attn_qkv", D, 3 * D)
            put(f"double_blocks_{i}_{s}_attn_proj", D, D, r=2)
            put(f"double_blocks_{i}_{s}_mlp_0", D, m)
            put(f"double_blocks_{i}_{s}_mlp_2", m, D)
            put(f"double_blocks_{i}_{s}_mod_lin", D, 6 * D, r=2, alpha=None)
    for i in range(CFG["num_single_layers"]):
        put(f"single_blocks_{i}_linear2", D + m, D)
        put(f"single_blocks_{i}_modulation_lin", D, 3 * D)
    return t


_TOP = {"img_in": "x_embedder", "txt_in": "context_embedder",
        "time_in_in_layer": "time_text_embed.timestep_embedder.linear_1",
        "guidance_in_out_layer": "time_text_embed.guidance_embedder.linear_2",
        "final_layer_linear": "proj_out", "final_layer_adaLN_modulation_1": "norm_out.linear"}


def _top_as_peft(kohya: dict) -> dict:
    """:func:`_kohya` ``top=True`` as diffusers / PEFT keys, written out from the format's
    facts: alpha / r folded into lora_B; linear1's one down shared, its up rows cut
    [D, D, D, 4D] onto to_q, to_k, to_v, proj_mlp; the final modulation's up halves swapped
    (BFL: shift, scale; diffusers: scale, shift)."""
    t = {}

    def put(module, down, up):
        t[f"transformer.{module}.lora_A.weight"] = down
        t[f"transformer.{module}.lora_B.weight"] = up

    for k in {k.split(".")[0] for k in kohya}:
        down, up = kohya[k + ".lora_down.weight"], kohya[k + ".lora_up.weight"]
        alpha = kohya.get(k + ".alpha")
        up = up * (1.0 if alpha is None else float(alpha) / down.shape[0])
        name = k.removeprefix("lora_unet_")
        if name.startswith("single_blocks_"):
            i = name.split("_")[2]
            for module, u in zip(("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
                                 np.split(up, [D, 2 * D, 3 * D])):
                put(f"single_transformer_blocks.{i}.{module}", down, u)
        elif name == "final_layer_adaLN_modulation_1":
            put(_TOP[name], down, np.concatenate(np.split(up, 2)[::-1]))
        else:
            put(_TOP[name], down, up)
    return t


def _xlabs(rng):
    t, p = {}, "double_blocks.{i}.processor."
    for i in range(CFG["num_layers"]):
        for name, dout in (("qkv_lora1", 3 * D), ("proj_lora1", D), ("qkv_lora2", 3 * D),
                           ("proj_lora2", D)):
            k = p.format(i=i) + name
            t[k + ".down.weight"], t[k + ".up.weight"] = pair(rng, 4, D, dout)
    for i in range(CFG["num_single_layers"]):
        k = f"single_blocks.{i}.processor.qkv_lora"
        t[k + ".down.weight"], t[k + ".up.weight"] = pair(rng, 4, D, 3 * D)
    return t


def _kohya_diffusers(rng):
    """kohya keys over diffusers names (``lora_transformer_``, diffusers' "mixture" files):
    the layers diffusers' reader maps (attention projections of both block kinds, the
    embedders, the final modulation and projection; it names the MLPs and modulations of the
    blocks wrongly, so those are checked by name in :func:`test_text_encoder_keys_refused`)."""
    t, m = {}, 4 * D
    names = [(f"transformer_blocks_{i}_attn_{n}", D, D) for i in range(CFG["num_layers"])
             for n in ("to_q", "to_k", "add_v_proj", "to_out_0", "to_add_out")]
    names += [(f"single_transformer_blocks_{i}_attn_{n}", D, D)
              for i in range(CFG["num_single_layers"]) for n in ("to_q", "to_v")]
    names += [("context_embedder", CFG["joint_attention_dim"], D), ("norm_out_linear", D, 2 * D),
              ("x_embedder", CFG["in_channels"], D), ("proj_out", D, CFG["in_channels"]),
              ("time_text_embed_timestep_embedder_linear_2", D, D)]
    for j, (name, din, dout) in enumerate(names):
        k = f"lora_transformer_{name}"
        t[k + ".lora_down.weight"], t[k + ".lora_up.weight"] = pair(rng, 2 + j % 3, din, dout)
        t[k + ".alpha"] = np.asarray(1.0 + j % 4, np.float32)
    return t


def _peft(rng):
    t, m = {}, 4 * D
    blocks = [(f"transformer_blocks.{i}.{n}", din, dout) for i in range(CFG["num_layers"])
              for n, din, dout in (("attn.to_q", D, D), ("attn.add_v_proj", D, D),
                                   ("attn.to_add_out", D, D), ("ff_context.net.2", m, D),
                                   ("norm1.linear", D, 6 * D))]
    blocks += [(f"single_transformer_blocks.{i}.{n}", din, dout)
               for i in range(CFG["num_single_layers"])
               for n, din, dout in (("attn.to_k", D, D), ("proj_mlp", D, m),
                                    ("proj_out", D + m, D))]
    blocks += [("norm_out.linear", D, 2 * D), ("context_embedder", CFG["joint_attention_dim"], D)]
    for name, din, dout in blocks:
        t[f"transformer.{name}.lora_A.weight"], t[f"transformer.{name}.lora_B.weight"] = \
            pair(rng, 3, din, dout)
    return t


@pytest.mark.parametrize("fmt", ["peft", "kohya", "xlabs", "kohya_diffusers"])
def test_format_matches_diffusers(tmp_path, base, fmt):
    folder, fresh, inputs, plain = base
    rng = np.random.default_rng({"peft": 1, "kohya": 2, "xlabs": 3, "kohya_diffusers": 6}[fmt])
    make = {"peft": _peft, "kohya": _kohya, "xlabs": _xlabs,
            "kohya_diffusers": _kohya_diffusers}[fmt]
    path = save(tmp_path / f"{fmt}.safetensors", make(rng))
    assert read_lora(path, names=LORA_NAMES).format == \
        {"peft": "peft", "kohya": "musubi", "xlabs": "original",
         "kohya_diffusers": "kohya_diffusers"}[fmt]
    want = diffusers_run(fresh, inputs, path, 0.7)
    assert rel_err(want, plain) > 1e-2          # the LoRA really changes the output
    got = ours(folder, inputs, loras=[(path, 0.7)])
    assert rel_err(got, want) <= TOL, rel_err(got, want)


def test_fused_linear1_top_layers_unmerged_and_strengths(tmp_path, base):
    """kohya's single-block linear1 (q, k, v and MLP rows), embedders and final layer against
    diffusers reading the same LoRA as PEFT keys (:func:`_kohya`'s note); BFL / ComfyUI names
    parse to the same rows as kohya's; unmerged equals merged over both stacks, new strengths
    without recompiling."""
    folder, fresh, inputs, plain = base
    rng = np.random.default_rng(4)
    kohya = _kohya(rng, top=True)
    path = save(tmp_path / "linear1.safetensors", kohya)
    ref = save(tmp_path / "linear1_peft.safetensors", _top_as_peft(kohya))
    want = diffusers_run(fresh, inputs, ref, 0.8)
    assert rel_err(want, plain) > 1e-2
    assert rel_err(ours(folder, inputs, loras=[(path, 0.8)]), want) <= TOL

    comfy = {k.replace("lora_unet_single_blocks_", "diffusion_model.single_blocks.")
              .replace("_linear1", ".linear1"): v for k, v in kohya.items() if "single" in k}
    rows = {r.key: r for r in read_lora(save(tmp_path / "c.safetensors", comfy),
                                        names=LORA_NAMES).rows}
    for r in (r for r in read_lora(path, names=LORA_NAMES).rows if r.key.startswith("single")):
        assert np.array_equal(rows[r.key].up, r.up) and rows[r.key].scale == r.scale
    assert sorted(rows)[:4] == ["single_transformer_blocks.0.attn.to_k",
                                "single_transformer_blocks.0.attn.to_q",
                                "single_transformer_blocks.0.attn.to_v",
                                "single_transformer_blocks.0.proj_mlp"]

    other = save(tmp_path / "kohya.safetensors", _kohya(np.random.default_rng(5)))
    loras = [(path, 0.6), (other, -0.5)]
    merged = ours(folder, inputs, loras=loras)
    tr = ditax.load_transformer(folder, loras=loras, lora_mode="unmerged")
    assert rel_err(np.asarray(tr(**inputs)), merged) <= TOL
    tr.set_lora_strengths([1.1, 0.3])
    again = ours(folder, inputs, loras=[(path, 1.1), (other, 0.3)])
    assert rel_err(np.asarray(tr(**inputs)), again) <= TOL


def test_text_encoder_keys_refused(tmp_path):
    """A kohya file with CLIP text-encoder rows (``lora_te1_``) is refused in one line naming
    them (ditax has no text-encoder LoRA); strict=False skips them and keeps the transformer's
    rows, the blocks' MLP / modulation names of ``lora_transformer_`` files included."""
    rng = np.random.default_rng(8)
    t = {}
    for name, din, dout in (("lora_transformer_transformer_blocks_1_ff_net_0_proj", D, 4 * D),
                            ("lora_transformer_single_transformer_blocks_2_proj_mlp", D, 4 * D),
                            ("lora_transformer_transformer_blocks_0_norm1_context_linear", D,
                             6 * D),
                            ("lora_te1_text_model_encoder_layers_0_self_attn_q_proj", 8, 8)):
        t[name + ".lora_down.weight"], t[name + ".lora_up.weight"] = pair(rng, 2, din, dout)
    path = save(tmp_path / "te.safetensors", t)
    with pytest.raises(WeightError) as e:
        read_lora(path, names=LORA_NAMES)
    msg = str(e.value)
    assert "2 text-encoder LoRA key(s)" in msg and "lora_te1_text_model_encoder_layers_0" in msg
    assert "\n" not in msg and "strict=False" in msg
    lora = read_lora(path, strict=False, names=LORA_NAMES)
    assert lora.format == "kohya_diffusers" and len(lora.unknown) == 2
    assert sorted(r.key for r in lora.rows) == [
        "single_transformer_blocks.2.proj_mlp", "transformer_blocks.0.norm1_context.linear",
        "transformer_blocks.1.ff.net.0.proj"]


def test_bad_files(tmp_path, base):
    folder, *_ = base
    rng = np.random.default_rng(7)
    bad = {"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": pair(rng, 2, D, 3 * D)[0],
           "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": np.zeros((3 * D + 1, 2),
                                                                             np.float32)}
    with pytest.raises(WeightError, match=r"has 97 rows; double_blocks.0.img_attn.qkv stacks 3"):
        read_lora(save(tmp_path / "odd.safetensors", bad), names=LORA_NAMES)
    far = {f"lora_unet_single_blocks_7_linear2.lora_{s}.weight": v for s, v in
           zip(("down", "up"), pair(rng, 2, 5 * D, D))}
    with pytest.raises(WeightError, match="single_transformer_blocks.7.proj_out: no such weight"):
        ditax.load_transformer(folder, loras=[save(tmp_path / "far.safetensors", far)])
    with pytest.raises(WeightError, match="not a Flux LoRA"):
        read_lora(save(tmp_path / "wan.safetensors",
                        {"diffusion_model.blocks.0.self_attn.q.lora_down.weight":
                         np.zeros((2, 4), np.float32)}), names=LORA_NAMES)


def test_load_pipeline_passes_loras(tmp_path, monkeypatch):
    """``ditax.load_pipeline(flux_folder, loras=..., lora_mode=..., lora_strict=...)`` hands
    them to the transformer's loader (whose LoRA paths the tests above check), before the
    text encoders and the VAE are read."""
    import json

    import ditax.models.flux.loading as flux_loading

    (tmp_path / "scheduler").mkdir()
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(
        {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 1.0}))
    seen = {}

    class Stop(Exception):
        pass

    def fake(path, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(flux_loading, "load_transformer", fake)
    with pytest.raises(Stop):
        ditax.load_pipeline(tmp_path, loras=[("a.safetensors", 0.5)], lora_mode="unmerged",
                            lora_strict=False)
    assert (seen["loras"], seen["lora_mode"], seen["lora_strict"]) == (
        [("a.safetensors", 0.5)], "unmerged", False)


def test_cli_generate_reads_flux_loras(tmp_path, monkeypatch, capsys):
    """``ditax generate --model FLUX_FOLDER --lora FILE:S --lora-mode unmerged`` reads the file
    with Flux's names and hands it to load_pipeline (a kohya file: fused qkv rows split)."""
    import json

    from ditax.cli import main
    from flux_reference import TINY

    (tmp_path / "m" / "transformer").mkdir(parents=True)
    (tmp_path / "m" / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    (tmp_path / "m" / "transformer" / "config.json").write_text(json.dumps(
        dict(TINY, _class_name="FluxTransformer2DModel")))
    (tmp_path / "m" / "vae").mkdir()       # the preflight reads the size grid's factor from it
    (tmp_path / "m" / "vae" / "config.json").write_text(json.dumps(
        {"_class_name": "AutoencoderKL", "block_out_channels": [128, 256, 512, 512]}))
    down, up = pair(np.random.default_rng(9), 2, D, 3 * D)
    path = save(tmp_path / "k.safetensors",
                {"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": down,
                 "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": up})
    seen = {}

    class Pipe:
        class timings:
            line = staticmethod(lambda: "t")

        def __call__(self, prompt, **kw):
            return np.zeros((kw["height"], kw["width"], 3), np.float32)

    monkeypatch.setattr(ditax, "load_pipeline", lambda p, **kw: seen.update(kw) or Pipe())
    assert main(["generate", "--model", str(tmp_path / "m"), "--prompt", "a cat", "--height",
                 "32", "--width", "32", "--steps", "1", "--no-progress", "--lora",
                 f"{path}:0.5", "--lora-mode", "unmerged", "--output",
                 str(tmp_path / "x.png")]) == 0, capsys.readouterr().err
    (lora, strength), = seen["loras"]
    assert strength == 0.5 and seen["lora_mode"] == "unmerged" and lora.format == "musubi"
    assert [r.key for r in lora.rows] == [f"transformer_blocks.0.attn.to_{c}" for c in "qkv"]
