"""A tiny random Wan 2.2 Animate pipeline folder saved in diffusers' format (UMT5, Wan 2.1 VAE,
CLIP, the Animate transformer with a 16 px motion encoder), for the Animate pipeline tests and
``benchmarks/pipeline.py --cases animate``; and diffusers' call with ditax's per-segment noise."""

import numpy as np

from i2v_reference import CLIP, Z, _clip, _scheduler, _vae21
from pipeline_reference import TEXT_DIM, make_text_parts


def make_tiny_animate(tmp):
    """``(diffusers WanAnimatePipeline, folder)`` of a tiny random Animate pipeline."""
    import torch
    from diffusers import WanAnimatePipeline, WanAnimateTransformer3DModel

    tok, enc = make_text_parts(tmp, 0)
    torch.manual_seed(3)
    tr = WanAnimateTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
        in_channels=2 * Z + 4, latent_channels=Z, out_channels=Z, text_dim=TEXT_DIM,
        freq_dim=32, ffn_dim=64, num_layers=2, image_dim=CLIP["hidden_size"],
        added_kv_proj_dim=32, motion_encoder_channel_sizes={"16": 8, "8": 12, "4": 8},
        motion_encoder_size=16, motion_style_dim=16, motion_dim=4, motion_encoder_dim=16,
        face_encoder_hidden_dim=8, face_encoder_num_heads=2, inject_face_latents_blocks=1,
        motion_encoder_batch_size=4)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in tr.named_parameters():
            gain = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            scale = 1.0 if "motion_encoder" in name else 0.5 / max(1, p.shape[-1]) ** 0.5
            p.copy_(torch.randn(p.shape, generator=g) * scale + gain)
    clip, proc = _clip(tmp, 5)
    ref = WanAnimatePipeline(tokenizer=tok, text_encoder=enc, vae=_vae21(2), scheduler=_scheduler(),
                             image_processor=proc, image_encoder=clip, transformer=tr.eval())
    ref.set_progress_bar_config(disable=True)
    ref.save_pretrained(tmp / "pipe")
    return ref, tmp / "pipe"


def diffusers_animate(ref, shape, seed, noises, **kw):
    """diffusers' ``WanAnimatePipeline`` call whose per-segment noise draws are ditax's
    (:func:`~ditax.pipelines.wan.animate.segment_noise` of the segments ``noises``)."""
    import diffusers
    import torch

    from ditax.pipelines.wan.animate import segment_noise

    mod = diffusers.pipelines.wan.pipeline_wan_animate
    draws = [torch.from_numpy(np.array(segment_noise(seed, s, shape))) for s in noises]
    orig = mod.randn_tensor
    mod.randn_tensor = lambda s, **_: draws.pop(0).reshape(s)
    try:
        with torch.no_grad():
            out = ref(output_type="np", **kw)
    finally:
        mod.randn_tensor = orig
    return np.asarray(out.frames[0], np.float32)
