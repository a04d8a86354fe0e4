"""CLIP image encoder and CLIPImageProcessor preprocessing against transformers (torch, CPU)."""

import json

import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import load_file, save_file  # noqa: E402

from ditax.errors import ConfigError, RequestError, WeightError  # noqa: E402
from ditax.models.encoders.clip import (CLIPImageProcessorConfig, CLIPVisionEncoder,  # noqa: E402
                               encode_image, load_image_encoder, load_image_processor,
                               preprocess_images)

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            image_size=32, patch_size=8, projection_dim=16, layer_norm_eps=1e-5)


def _tiny_model(seed=0, cls="CLIPVisionModel", **over):
    torch.manual_seed(seed)
    cfg = transformers.CLIPVisionConfig(**{**TINY, **over})
    model = getattr(transformers, cls)(cfg).eval()
    with torch.no_grad():  # default init leaves norms at 1/0 and embeddings tiny: make them matter
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_((1.0 if n.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            elif "embedding" in n:
                p.copy_(torch.randn_like(p))
    return model


def _save(model, folder):
    model.save_pretrained(folder)
    return folder


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# transformers 5 picks a torchvision backend when torchvision is installed; the reference here is
# the PIL backend (transformers 4's only one), which ditax reproduces.
HFProcessor = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)


def _hf_processor(folder):
    return HFProcessor.from_pretrained(folder)


@pytest.mark.parametrize("act", ["quick_gelu", "gelu"])
def test_encoder_matches_transformers(tmp_path, rng, act):
    model = _tiny_model(hidden_act=act)
    _save(model, tmp_path / "image_encoder")
    enc = load_image_encoder(tmp_path)  # pipeline-style folder: finds image_encoder/
    assert isinstance(enc, CLIPVisionEncoder)
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x), output_hidden_states=True)
    hs = [h.numpy() for h in ref.hidden_states]
    out = np.asarray(enc.penultimate(jnp.asarray(x)))
    assert out.shape == hs[-2].shape == (2, 17, 32) and out.dtype == np.float32
    err = _rel(out, hs[-2])
    print(f"clip {act} penultimate rel err {err:.2e}")
    assert err < 1e-5
    for n in range(len(hs)):  # every depth, the embeddings (n=0) included
        assert _rel(np.asarray(enc(x, layers=n)), hs[n]) < 1e-5, n
    pooled = np.asarray(enc.pooled(x))
    assert _rel(pooled, ref.pooler_output.numpy()) < 1e-5


def test_with_projection_checkpoint_and_bf16(tmp_path, rng):
    """The Wan folders' layout: ``vision_model.*`` keys plus an unused ``visual_projection``."""
    model = _tiny_model(seed=1, cls="CLIPVisionModelWithProjection", hidden_act="gelu")
    folder = _save(model, tmp_path / "enc")
    assert "visual_projection.weight" in load_file(folder / "model.safetensors")
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x), output_hidden_states=True)
    out = np.asarray(load_image_encoder(folder).penultimate(x))
    assert _rel(out, ref.hidden_states[-2].numpy()) < 1e-5
    enc16 = load_image_encoder(folder, dtype="bfloat16")
    assert enc16.embeddings.patch_embedding[...].dtype == jnp.bfloat16
    out16 = np.asarray(enc16.penultimate(x)).astype(np.float32)
    assert _rel(out16, out) < 5e-2


def _broken(tmp_path, edit):
    folder = _save(_tiny_model(), tmp_path / "bad")
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_bad_folders_raise_weight_error(tmp_path):
    key = "encoder.layers.1.mlp.fc1.weight"
    folder = _broken(tmp_path / "a", lambda t: t.pop(key))
    with pytest.raises(WeightError, match=r"missing 1 key.*vision_model\." + key):
        load_image_encoder(folder)
    folder = _broken(tmp_path / "b", lambda t: t.update({key: t[key][:, :5]}))
    with pytest.raises(WeightError, match=key + r": shape \(64, 5\).*\(64, 32\)"):
        load_image_encoder(folder)
    folder = _broken(tmp_path / "c", lambda t: t.update({"extra.weight": t[key]}))
    with pytest.raises(WeightError, match=r"unexpected 1 key.*extra\.weight"):
        load_image_encoder(folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu_bad"}))
    with pytest.raises(ConfigError, match="hidden_act"):
        load_image_encoder(folder)


# ------------------------------------------------------------------------------ preprocessing

def _processor_folder(tmp_path, **over):
    proc = HFProcessor(**over)
    proc.save_pretrained(tmp_path / "image_processor")
    return tmp_path


@pytest.mark.parametrize("hw", [(37, 50), (90, 41), (224, 224)])
def test_preprocess_pil_matches_processor(tmp_path, rng, hw):
    folder = _processor_folder(tmp_path)
    ours_cfg, theirs = load_image_processor(folder), _hf_processor(folder / "image_processor")
    assert ours_cfg == CLIPImageProcessorConfig()  # the saved defaults read back as CLIP's
    u8 = (rng.random(hw + (3,)) * 255).astype(np.uint8)
    rgba = np.concatenate([u8, (rng.random(hw + (1,)) * 255).astype(np.uint8)], -1)
    images = [PIL.Image.fromarray(u8), PIL.Image.fromarray(rgba, "RGBA"),
              PIL.Image.fromarray(u8[..., 0], "L")]
    for im in images:
        ref = theirs(images=im, return_tensors="np")["pixel_values"]
        out = preprocess_images(im, ours_cfg)
        assert out.shape == ref.shape == (1, 3, 224, 224) and out.dtype == np.float32
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(preprocess_images(u8, ours_cfg), preprocess_images(images[0]))


def test_preprocess_float_arrays(tmp_path, rng):
    folder = _processor_folder(tmp_path)
    cfg, theirs = load_image_processor(folder), _hf_processor(folder / "image_processor")
    f = rng.random((45, 61, 3)).astype(np.float32)
    # "unit": a float image in [0, 1], not rescaled again
    ref = theirs(images=f, do_rescale=False, return_tensors="np")["pixel_values"]
    np.testing.assert_allclose(preprocess_images(f, cfg), ref, rtol=0, atol=1e-6)
    f64 = f.astype(np.float64)
    ref64 = theirs(images=f64, do_rescale=False, return_tensors="np")["pixel_values"]
    np.testing.assert_allclose(preprocess_images(f64, cfg), ref64, rtol=0, atol=1e-6)
    # "diffusers": what the processor does with the array diffusers hands it (rescaled twice)
    ref2 = theirs(images=[f, f[::-1]], return_tensors="np")["pixel_values"]
    out2 = preprocess_images([f, f[::-1]], cfg, floats="diffusers")
    np.testing.assert_allclose(out2, ref2, rtol=0, atol=1e-6)
    with pytest.raises(RequestError, match=r"\[0, 1\]"):
        preprocess_images(f * 2, cfg)
    with pytest.raises(RequestError, match=r"\[H, W, 3\]"):
        preprocess_images(np.moveaxis(f, -1, 0), cfg)


@pytest.mark.parametrize("over", [
    dict(size=20, crop_size=24, resample=2, image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.3, 0.4]),
    dict(size={"height": 30, "width": 18}, crop_size={"height": 24, "width": 24}),
    dict(do_resize=False, crop_size={"height": 16, "width": 40}, rescale_factor=0.5),
])
def test_preprocess_config_forms(tmp_path, rng, over):
    folder = _processor_folder(tmp_path, **over)
    cfg, theirs = load_image_processor(folder), _hf_processor(folder / "image_processor")
    im = PIL.Image.fromarray((rng.random((33, 27, 3)) * 255).astype(np.uint8))
    ref = theirs(images=im, return_tensors="np")["pixel_values"]
    np.testing.assert_allclose(preprocess_images(im, cfg), ref, rtol=0, atol=1e-6)


def test_processor_config_errors():
    with pytest.raises(ConfigError, match="unknown_key"):
        CLIPImageProcessorConfig.from_dict({"unknown_key": 1})
    with pytest.raises(ConfigError, match="do_pad"):
        CLIPImageProcessorConfig.from_dict({"do_pad": True})
    with pytest.raises(ConfigError, match="size"):
        CLIPImageProcessorConfig.from_dict({"size": {"longest_edge": 300}})
    with pytest.raises(ConfigError, match="resample"):
        CLIPImageProcessorConfig.from_dict({"resample": 9})


def test_encode_image_matches_diffusers_formula(tmp_path, rng):
    """Processor + ``hidden_states[-2]`` as diffusers' ``encode_image``, for two images (FLF2V)."""
    model = _tiny_model(seed=2, hidden_act="gelu")
    _save(model, tmp_path / "image_encoder")
    _processor_folder(tmp_path, size={"shortest_edge": 32}, crop_size=32)
    enc, cfg = load_image_encoder(tmp_path), load_image_processor(tmp_path)
    theirs = _hf_processor(tmp_path / "image_processor")
    images = [PIL.Image.fromarray((rng.random(s) * 255).astype(np.uint8))
              for s in ((40, 70, 3), (64, 48, 3))]
    with torch.no_grad():
        px = theirs(images=images, return_tensors="pt")
        ref = model(**px, output_hidden_states=True).hidden_states[-2].numpy()
    out = np.asarray(encode_image(enc, images, cfg))
    err = _rel(out, ref)
    print(f"clip encode_image rel err {err:.2e}")
    assert out.shape == (2, 17, 32) and err < 1e-5
    with pytest.raises(RequestError, match=r"pixel_values must be \[B, 3, 32, 32\]"):
        encode_image(enc, images, CLIPImageProcessorConfig())
