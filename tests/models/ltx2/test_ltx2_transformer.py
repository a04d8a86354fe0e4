"""LTX-2 transformer: parity with diffusers (forward and gradient, both streams; LTX-2-like
scanned under save_proj remat, LTX-2.3-like unrolled under full remat; spatio-temporal
guidance, crossed sigmas, keyframes), RoPE coordinates, the presets at full size (headers
only), the family's shapes, and bad configs and inputs. Meshes and isolate_modalities:
test_ltx2_transformer_parallel.py."""

import json
import shutil

import numpy as np
import pytest
import torch
from flax import nnx

import ditax
from ditax.errors import ConfigError, RequestError, WeightError
from ditax.io.convert import check_weights, export, param_shapes
from ditax.models.ltx2.transformer.build import abstract_model
from ditax.models.ltx2.transformer.convert import weight_table
from ltx2_reference import LTX2, LTX23, ltx2_inputs, make_diffusers_ltx2, run_diffusers_ltx2
from shared_inputs import output_and_grads
from wan_reference import rel_err

GRAD_INPUTS = ("hidden_states", "audio_hidden_states", "encoder_hidden_states",
               "audio_encoder_hidden_states")


def _extras(rng, name, inputs):
    """LTX-2-like: spatio-temporal guidance of block 0, every sample perturbed (no mask: the
    self-attentions give their values). LTX-2.3-like: sigma and the other stream's, crossed;
    a keyframe mask; STG of block 1 with per-sample weights."""
    if name == "ltx2":
        return dict(inputs, spatio_temporal_guidance_blocks=[0])
    b, seq = inputs["hidden_states"].shape[:2]
    return dict(inputs, sigma=rng.uniform(0, 1000, b).astype(np.float32),
                audio_sigma=rng.uniform(0, 1000, b).astype(np.float32),
                use_cross_timestep=True,
                video_keyframes_mask=(rng.uniform(size=(b, seq, 1)) > 0.5).astype(np.float32),
                spatio_temporal_guidance_blocks=[1],
                perturbation_mask=np.array([0.0, 0.6], np.float32))


@pytest.mark.parametrize("name,numerics", [
    # split RoPE, caption projections; per-token video timesteps; scanned, save_proj remat
    ("ltx2", dict(remat="save_proj")),
    # gates, text modulation, keyframes, crossed sigmas; unrolled blocks, full remat
    ("ltx23", dict(scan_layers=False, remat="full")),
], ids=["ltx2-scanned", "ltx23-unrolled-remat"])
def test_forward_and_gradient_match_diffusers(tmp_path, rng, fast_compile, name, numerics):
    """Both outputs and the gradient (w.r.t. the four token / text inputs and every parameter,
    in diffusers' keys and layouts) against torch autograd, from one compiled program; STG
    in the scanned stack (its layer count picks the block) and in the unrolled one."""
    config = LTX2 if name == "ltx2" else LTX23
    m, folder = make_diffusers_ltx2(tmp_path, **config)
    inputs = _extras(rng, name, ltx2_inputs(rng, config, per_token=name == "ltx2"))
    tr = ditax.load_transformer(folder, **numerics)
    ref = run_diffusers_ltx2(m, inputs)
    cts = [rng.standard_normal(r.shape).astype(np.float32) for r in ref]

    out, grads = output_and_grads(tr, inputs, GRAD_INPUTS, tuple(cts))
    for o, r in zip(out, ref):
        assert o.shape == r.shape and rel_err(o, r) <= 1e-5, rel_err(o, r)

    leaves = {k: torch.from_numpy(v).requires_grad_(k in GRAD_INPUTS)
              if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    v, a = m(**leaves, return_dict=False)
    ((v * torch.from_numpy(cts[0])).sum() + (a * torch.from_numpy(cts[1])).sum()).backward()
    for n, g in zip(GRAD_INPUTS, grads[1:]):
        assert rel_err(g, leaves[n].grad.numpy()) <= 1e-5, (n, rel_err(g, leaves[n].grad.numpy()))
    ours = export(weight_table(tr.config), grads[0]._state)     # diffusers keys and layouts
    # a block whose samples are all perturbed skips q / k in diffusers: no gradient there
    theirs = {k: np.zeros(p.shape, np.float32) if p.grad is None else p.grad.numpy()
              for k, p in m.named_parameters()}
    assert set(ours) == set(theirs)
    assert all(not ours[k].any() for k, p in m.named_parameters() if p.grad is None)
    errs = {k: rel_err(ours[k], theirs[k]) for k in theirs}
    assert max(errs.values()) <= 1e-5, {k: e for k, e in errs.items() if e > 1e-5}


def test_rope_coordinates_and_frequencies_equal_diffusers():
    """The coordinates from the latent sizes (bit for bit, at fps 24 and 25) and the RoPE
    frequencies of the full-size tables (float64 arithmetic) are diffusers' own."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    from ditax.models.ltx2.transformer import rope as R

    video = LTX2AudioVideoRotaryPosEmbed(dim=4096, patch_size=1, patch_size_t=1)
    audio = LTX2AudioVideoRotaryPosEmbed(dim=2048, scale_factors=[4], modality="audio")
    for fps in (24.0, 25.0):
        want = video.prepare_video_coords(1, 16, 5, 7, "cpu", fps=fps).numpy()
        got = R.video_coords(16, 5, 7, patch_size=1, patch_size_t=1, scale_factors=(8, 32, 32),
                             causal_offset=1, fps=fps)
        np.testing.assert_array_equal(got, want)
    want = audio.prepare_audio_coords(1, 126, "cpu").numpy()
    got = R.audio_coords(126, patch_size_t=1, scale_factor=4, causal_offset=1, hop_length=160,
                         sampling_rate=16000)
    np.testing.assert_array_equal(got, want)
    for n in (682, 1024, 341, 170, 2):
        ref = (torch.pow(10000.0, torch.linspace(0.0, 1.0, n, dtype=torch.float64)) * torch.pi
               / 2.0).to(torch.float32).numpy()
        np.testing.assert_array_equal(R.frequencies(n, 10000.0, True), ref)


def test_full_size_presets_match_diffusers_keys_shapes_and_size():
    """LTX-2 and LTX-2.3 (the presets) have exactly diffusers' keys and shapes (a meta
    model's state dict against the table, headers only); LTX-2 has 18.9 B parameters."""
    from diffusers import LTX2VideoTransformer3DModel

    from ditax.config import load_config
    from ditax.models.ltx2.config import DIFFUSERS_FIELDS

    class Header:
        def __init__(self, sd):
            self.sd = sd

        def keys(self):
            return self.sd.keys()

        def shape(self, key):
            return tuple(self.sd[key].shape)

    sizes = {}
    for name in ("ltx-2", "ltx-2.3"):
        cfg = load_config(name).model
        with torch.device("meta"):
            ref = LTX2VideoTransformer3DModel(**{f: getattr(cfg, f) for f in DIFFUSERS_FIELDS})
        shapes = param_shapes(nnx.state(abstract_model(cfg)))
        check_weights(weight_table(cfg), Header(ref.state_dict()), shapes)
        sizes[name] = sum(int(np.prod(s)) for s in shapes.values())
        assert sizes[name] == sum(p.numel() for p in ref.parameters())
    assert sizes["ltx-2"] / 1e9 == pytest.approx(18.88, abs=0.01), sizes


def test_family_grid_and_folder_check(tmp_path):
    """The family's video grid (LTX-2's VAE: 8·k + 1 frames, 32-pixel latents), the audio
    tokens of a clip (121 frames at 24 fps: 126 at 25 a second) and ``ditax convert``'s
    folder check."""
    from ditax.config import load_config
    from ditax.models.base import model_family

    family = model_family(load_config("ltx-2").model)
    assert family.name == "ltx2" and family.latent_channels == 128
    assert family.latent_shape(121, 512, 768) == (128, 16, 16, 24)
    assert family.audio_tokens((128, 16, 16, 24)) == 126
    with pytest.raises(ConfigError, match=r"120 frames"):
        family.latent_grid(120, 512, 768)
    with pytest.raises(ConfigError, match=r"500x768"):
        family.latent_grid(121, 500, 768)
    _, folder = make_diffusers_ltx2(tmp_path, **LTX2)
    assert "OK — 2 blocks, video D=16" in family.check_folder(folder, None)


def test_bad_configs_and_inputs_give_one_clear_line(tmp_path, rng):
    from ditax.parallel import make_mesh

    _, folder = make_diffusers_ltx2(tmp_path, **LTX2)
    good = json.loads((folder / "config.json").read_text())

    def with_config(name, **change):
        bad = tmp_path / name
        shutil.copytree(folder, bad)
        (bad / "config.json").write_text(json.dumps({**good, **change}))
        return bad

    config_cases = [
        (dict(use_frame_conditioning=True), r"config.json key\(s\) use_frame_conditioning: "
                                            r"ditax does not support it yet"),
        (dict(activation_fn="gelu"), r"activation_fn='gelu': ditax does not support it yet"),
        (dict(audio_cross_attention_dim=12), r"audio_cross_attention_dim=12 must equal the "
                                             r"audio width .* = 16"),
        (dict(rope_type="axial"), r"rope_type='axial' is not one of interleaved, split"),
        (dict(num_layers=3), r"missing \d+ key\(s\): transformer_blocks\.2\."),
    ]
    for i, (change, msg) in enumerate(config_cases):
        with pytest.raises((ConfigError, WeightError), match=msg):
            ditax.load_transformer(with_config(f"bad{i}", **change))
    with pytest.raises(ConfigError, match=r"audio_num_attention_heads=2 is not divisible by "
                                          r"mesh.tensor=4|num_attention_heads=2 is not "
                                          r"divisible by mesh.tensor=4"):
        ditax.load_transformer(folder, mesh=make_mesh({"tensor": 4, "fsdp": 2}))

    tr = ditax.load_transformer(folder)
    x = ltx2_inputs(rng, LTX2)
    b, seq = x["hidden_states"].shape[:2]
    cases = [
        (dict(hidden_states=x["hidden_states"][..., :3]),
         r"hidden_states must be packed video tokens \[B, L, in_channels=4\]; got shape "
         r"\(2, 18, 3\)"),
        (dict(audio_hidden_states=x["audio_hidden_states"][:1]),
         r"audio_hidden_states must be packed audio tokens \[B=2, La, audio_in_channels=4\]"),
        (dict(encoder_hidden_states=x["encoder_hidden_states"][..., :5]),
         r"encoder_hidden_states must be \[B=2, T, 12\]"),
        (dict(encoder_attention_mask=x["encoder_attention_mask"][:, None]),
         r"encoder_attention_mask must be \[B, T\] = \(2, 6\)"),
        (dict(timestep=np.ones((b, 4), np.float32)),
         r"timestep must be a scalar, \[B=2\] or one per token \[B=2, 18\]"),
        (dict(timestep=np.ones((b, seq), np.float32)), r"so audio_timestep must be given"),
        (dict(height=4), r"4x3 latents make 24 tokens .* but hidden_states has L=18"),
        (dict(num_frames=None), r"num_frames not given: the video RoPE needs"),
        (dict(audio_num_frames=7), r"audio_num_frames=7 makes 7 audio tokens, but "
                                   r"audio_hidden_states has La=5"),
        (dict(video_coords=np.zeros((2, 3, 18), np.float32)[:, :1]),
         r"video_coords must be \[B=2, 3, L=18, 2\]"),
        (dict(audio_coords=np.zeros((2, 1, 4), np.float32)),
         r"audio_coords must be \[B=2, 1, La=5, 2\] \(each token's \[start, end\) in "
         r"seconds\) or \[B, 1, La\]"),
        (dict(spatio_temporal_guidance_blocks=[2]), r"\[2\] are no block indices of this "
                                                    r"model \(0..1\)"),
        (dict(perturbation_mask=np.ones(2, np.float32)), r"perturbation_mask is given without"),
        (dict(video_self_attention_mask=np.ones((2, seq, seq), np.float32)),
         r"video_self_attention_mask=\(2, 18, 18\): ditax does not support soft"),
        (dict(attention_kwargs={"scale": 0.5}), r"attention_kwargs=\{'scale': 0.5\}: ditax "
                                                r"does not support"),
        (dict(video_keyframes_mask=np.ones((2, seq, 1), np.float32)),
         r"use_keyframes_abs_pos_embedding=False\); pass video_keyframes_mask=None"),
        (dict(use_cross_timestep=True), r"use_cross_timestep=True takes .* pass sigma"),
    ]
    for change, msg in cases:
        with pytest.raises(RequestError, match=msg) as e:
            tr(**{**x, **change})
        assert len(str(e.value).splitlines()) == 1
    with pytest.raises(TypeError, match=r"audio_timesteps"):    # no keyword of the call
        tr(**x, audio_timesteps=x["timestep"])
    with pytest.raises(RequestError, match=r"perturbed_attn=false \(diffusers then ignores"):
        ditax.load_transformer(with_config("plain", perturbed_attn=False))(
            **x, spatio_temporal_guidance_blocks=[1])
    with pytest.raises(ConfigError, match=r"batch=2 is not divisible"):
        ditax.load_transformer(folder, mesh=make_mesh({"fsdp": 8}))(**x)
