"""Wan 2.2 Animate transformer vs diffusers' WanAnimateTransformer3DModel on a tiny random model
saved in its own format (motion encoder at 16 px with two blurred residual blocks, face encoder,
two face adapters, pose path, CLIP image tokens), loaded by ``ditax.load_transformer`` through
the folder's ``_class_name``: forward within 1e-5 relative (float32, two samples, three motion
batches); strict keys; bad pose / face inputs."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.errors import WeightError  # noqa: E402
from wan_image_model import IMAGE_DIM, IMAGE_TOKENS, TEXT_LEN  # noqa: E402
from wan_reference import rel_err  # noqa: E402

Z = 4
CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
              in_channels=2 * Z + 4, latent_channels=Z, out_channels=Z, text_dim=32,
              freq_dim=32, ffn_dim=64, num_layers=2, image_dim=IMAGE_DIM, added_kv_proj_dim=32,
              rope_max_seq_len=1024, motion_encoder_channel_sizes={"16": 8, "8": 12, "4": 8},
              motion_encoder_size=16, motion_style_dim=16, motion_dim=4, motion_encoder_dim=16,
              face_encoder_hidden_dim=8, face_encoder_num_heads=2, inject_face_latents_blocks=1,
              motion_encoder_batch_size=4)


@pytest.fixture(scope="module")
def animate(tmp_path_factory):
    from diffusers import WanAnimateTransformer3DModel

    torch.manual_seed(0)
    m = WanAnimateTransformer3DModel(**CONFIG)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():   # everything random, so a wrong mapping shows
            gain = 1.0 if name.endswith(("norm_q.weight", "norm_k.weight")) else 0.0
            scale = 1.0 if "motion_encoder" in name else 0.5 / max(1, p.shape[-1]) ** 0.5
            p.copy_(torch.randn(p.shape, generator=g) * scale + gain)
    m.eval()
    folder = tmp_path_factory.mktemp("animate") / "transformer"
    m.save_pretrained(folder)
    return m, folder, ditax.load_transformer(folder)


def _inputs(seed, b=2, f=3, y=4, x=6):
    rng = np.random.default_rng(seed)
    a = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(latents=a(b, 2 * Z + 4, f, y, x),
                timestep=rng.uniform(0, 1000, (b,)).astype(np.float32),
                text=a(b, TEXT_LEN, 32), image=a(b, IMAGE_TOKENS, IMAGE_DIM),
                pose=a(b, Z, f - 1, y, x),
                face=np.tanh(a(b, 3, 4 * (f - 2) + 1, 16, 16)))


def _diffusers(m, inp):
    t = {k: torch.from_numpy(v) for k, v in inp.items()}
    with torch.no_grad():
        return m(t["latents"], t["timestep"], t["text"], encoder_hidden_states_image=t["image"],
                 pose_hidden_states=t["pose"], face_pixel_values=t["face"],
                 return_dict=False)[0].numpy()


def _ours(tr, inp):
    return np.asarray(tr(inp["latents"], inp["timestep"], inp["text"],
                         encoder_hidden_states_image=inp["image"], pose_hidden_states=inp["pose"],
                         face_pixel_values=inp["face"]))


def test_forward_matches_diffusers(animate):
    m, _, tr = animate
    assert type(tr).__name__ == "AnimateTransformer"
    assert tr.module.cfg.num_face_adapters == 2
    inp = _inputs(0)
    want = _diffusers(m, inp)
    got = _ours(tr, inp)
    err = rel_err(got, want)
    print(f"animate forward: rel err vs diffusers {err:.2e}")
    assert got.shape == want.shape == (2, Z, 3, 4, 6)
    assert err < 1e-5, err
    # the face and pose paths matter: other faces / poses change the output
    for k in ("face", "pose"):
        other = dict(inp, **{k: np.roll(inp[k], 1, axis=2)})
        assert rel_err(_ours(tr, other), got) > 1e-3, k


def test_strict_keys(animate, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, folder, _ = animate
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((folder / "config.json").read_text())
    weights = load_file(str(next(folder.glob("*.safetensors"))))
    del weights["face_adapter.1.to_k.weight"]
    weights["motion_encoder.extra.weight"] = np.zeros(3, np.float32)
    save_file(weights, str(bad / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(WeightError, match=r"face_adapter.1.to_k.weight(.|\n)*motion_encoder.extra"):
        ditax.load_transformer(bad)


@pytest.mark.parametrize("change,match", [
    (dict(pose=None), r"pose_hidden_states must be \[B=2, 4, F-1=2, 4, 6\]"),
    (dict(face=np.zeros((2, 3, 9, 16, 16), np.float32)), r"has 9 frames.*need 2 \(e.g. 5"),
    (dict(face=np.zeros((2, 3, 5, 8, 8), np.float32)), r"face_pixel_values must be \[B=2, 3, S, 16"),
])
def test_bad_inputs(animate, change, match):
    _, _, tr = animate
    inp = dict(_inputs(1), **change)
    with pytest.raises(ValueError, match=match):
        _ours(tr, inp)


def test_config_rules(animate, tmp_path):
    from ditax.errors import ConfigError

    _, folder, _ = animate
    cfg = json.loads((folder / "config.json").read_text())
    cfg["inject_face_latents_blocks"] = 3
    bad = tmp_path / "cfg"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(cfg))
    for w in folder.glob("*.safetensors"):
        (bad / w.name).symlink_to(w)
    with pytest.raises(ConfigError, match="inject_face_latents_blocks=3 must divide num_layers=2"):
        ditax.load_transformer(bad)
