"""Tiny random diffusers image-to-video pipelines (torch), saved in their own format, for the
image-to-video pipeline, CLI and training tests.

Kinds: ``i2v`` (Wan 2.1 I2V: CLIP image encoder + processor, image embedder, 36-channel layout
with tiny widths), ``flf2v`` (the same with the first-last-frame ``pos_embed``), ``i2v22``
(Wan 2.2 I2V A14B: two experts, boundary_ratio, no image encoder), ``ti2v`` (Wan 2.2 TI2V-5B:
the residual 2.2 VAE, ``expand_timesteps``; saved as the WanPipeline folder the 5B ships as).
"""

from __future__ import annotations

import numpy as np

from pipeline_reference import TEXT_DIM, _randomize, make_text_parts
from wan_reference import make_diffusers_wan

Z = 4                 # Wan 2.1 VAE latent channels here
Z22 = 12              # Wan 2.2 VAE latent channels here (48 upstream)
CLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            image_size=32, patch_size=8, projection_dim=16, layer_norm_eps=1e-5,
            hidden_act="gelu")
CLIP_TOKENS = 1 + (32 // 8) ** 2   # 17 (257 for ViT-H/14 at 224)
KINDS = ("i2v", "flf2v", "i2v22", "ti2v")
PROMPT = dict(prompt="a cat walks on the grass", negative_prompt="blurry, low quality")
# Wan 2.1 VAE: 8x spatial, patch 2 → 16; the 2.2 VAE: 16x → 32 pixels per token
SIZE21 = dict(height=32, width=48, num_frames=5)
SIZE22 = dict(height=32, width=64, num_frames=9)


def _vae21(seed):
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(base_dim=8, z_dim=Z, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=list(np.linspace(-0.5, 0.5, Z)),
                           latents_std=list(np.linspace(0.8, 2.0, Z)))
    return _finish_vae(vae, seed)


def _vae22(seed):
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=12, z_dim=Z22, dim_mult=[1, 2, 4, 4],
                           num_res_blocks=1, temperal_downsample=[False, True, True],
                           is_residual=True, patch_size=2, in_channels=12, out_channels=12,
                           scale_factor_spatial=16, scale_factor_temporal=4,
                           latents_mean=list(np.linspace(-0.4, 0.4, Z22)),
                           latents_std=list(np.linspace(0.7, 1.8, Z22)))
    return _finish_vae(vae, seed)


def _finish_vae(vae, seed):
    import torch

    _randomize(vae, seed)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(0.3)   # keep pixels mostly inside [-1, 1]
    return vae


def _clip(folder, seed):
    """A random ``CLIPVisionModel`` and its ``CLIPImageProcessor`` (PIL backend)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    enc = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**CLIP)).eval()
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if "norm" in n:
                p.copy_((1.0 if n.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            elif "embedding" in n:
                p.copy_(torch.randn_like(p))
    cls = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)
    proc = cls(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return enc, proc


def _transformer(tmp_path, name, seed, **kw):
    """A random tiny Wan transformer whose every norm gain is near 1 (so the image tokens'
    ``norm_added_k`` and the image embedder's norms carry signal)."""
    import torch

    m, folder = make_diffusers_wan(tmp_path / name, seed=seed, heads=4, head_dim=8, layers=2,
                                   ffn=48, text_dim=TEXT_DIM, freq_dim=32, **kw)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n and n.endswith("weight") and not n.endswith(("norm_q.weight",
                                                                       "norm_k.weight")):
                p.add_(1.0)
    m.save_pretrained(folder)
    return m


def _scheduler():
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                   num_train_timesteps=1000, flow_shift=3.0)


def make_tiny_i2v(tmp_path, kind: str, seed: int = 0, boundary_ratio: float = 0.8):
    """Build and save a tiny pipeline of ``kind`` (see the module docstring); returns
    ``(diffusers pipelines {"text": WanPipeline or None, "image": WanImageToVideoPipeline},
    folder)``. The two ``ti2v`` pipelines share their components."""
    from diffusers import WanImageToVideoPipeline, WanPipeline

    if kind not in KINDS:
        raise ValueError(kind)
    tok, enc = make_text_parts(tmp_path, seed)
    common = dict(tokenizer=tok, text_encoder=enc, scheduler=_scheduler())
    if kind == "ti2v":
        vae = _vae22(seed + 2)
        tr = _transformer(tmp_path, "_t1", seed + 3, in_ch=Z22)
        text = WanPipeline(vae=vae, transformer=tr, expand_timesteps=True, **common)
        image = WanImageToVideoPipeline(vae=vae, transformer=tr, expand_timesteps=True,
                                        **common)
        save = text
    else:
        vae = _vae21(seed + 2)
        tkw = dict(in_ch=2 * Z + 4, out_ch=Z)
        extra = {}
        if kind in ("i2v", "flf2v"):
            d = 4 * 8
            tkw.update(image_dim=CLIP["hidden_size"], added_kv_proj_dim=d,
                       pos_embed_seq_len=2 * CLIP_TOKENS if kind == "flf2v" else None)
            extra["image_encoder"], extra["image_processor"] = _clip(tmp_path, seed + 5)
        tr = _transformer(tmp_path, "_t1", seed + 3, **tkw)
        if kind == "i2v22":
            extra.update(transformer_2=_transformer(tmp_path, "_t2", seed + 4, **tkw),
                         boundary_ratio=boundary_ratio)
        image = WanImageToVideoPipeline(vae=vae, transformer=tr, **common, **extra)
        text, save = None, image
    for p in (text, image):
        if p is not None:
            p.set_progress_bar_config(disable=True)
    folder = tmp_path / kind
    save.save_pretrained(folder)
    return {"text": text, "image": image}, folder


def image(seed: int, height: int, width: int, kind: str = "pil"):
    """A smooth random test image (PIL RGB, or float ``[H, W, 3]`` in [0, 1])."""
    import PIL.Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
    x = np.stack([0.5 + 0.4 * np.sin(6 * xx * rng.uniform(0.5, 2) + rng.uniform(0, 6)
                                     + 4 * yy * rng.uniform(-1, 1)) for _ in range(3)], -1)
    x = np.clip(x + 0.05 * rng.standard_normal(x.shape), 0, 1)
    if kind == "float":
        return x.astype(np.float32)
    return PIL.Image.fromarray((x * 255).round().astype(np.uint8))


def run_reference(pipe, latents, **kw):
    """diffusers' video ``[F, H, W, 3]`` in [0, 1] from fixed initial latents."""
    import torch

    with torch.no_grad():
        out = pipe(latents=torch.from_numpy(np.asarray(latents)), output_type="np", **kw)
    return np.asarray(out.frames[0], np.float32)


def tiny_i2v_pipelines(tmp_path_factory):
    """``get(kind)`` → a loaded pipeline of :func:`make_tiny_i2v`'s ``kind`` folder, each
    built once (a module fixture's body; skips without torch / diffusers)."""
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    import ditax

    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = ditax.load_pipeline(make_tiny_i2v(tmp_path_factory.mktemp(kind),
                                                            kind)[1])
        return cache[kind]
    return get
