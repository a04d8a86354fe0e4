"""Tiny random diffusers ``AutoencoderKLLTX2Video`` models (LTX-2's video VAE) for parity tests.

Both share the LTX-2 encoder's resampler kinds (spatial, temporal, spatio-temporal space-to-depth)
with 2x2 pixel patches: 8x spatial, 4x temporal (videos of 4k + 1 frames, sizes multiples of 8).
The decoders are the two checkpoints' switches:

- ``"ltx2"`` (LTX-2.0): residual 2x spatio-temporal upsamplers, reflect padding, timestep
  conditioning (time embedders in the mid and up blocks and before ``conv_out``);
- ``"ltx23"`` (LTX-2.3): spatio-temporal, temporal and spatial upsamplers without residual,
  upsample factors 2, 1, 2, zero padding, and a level that changes width (the ``conv_in``
  resnet with its LayerNorm / 1x1x1 shortcut).
"""

from __future__ import annotations

import numpy as np

_ENCODER = dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=[16, 16, 32],
                down_block_types=["LTX2VideoDownBlock3D"] * 3, layers_per_block=[1, 0, 1, 1],
                spatio_temporal_scaling=[True, True, True],
                downsample_type=["spatial", "temporal", "spatiotemporal"], patch_size=2,
                patch_size_t=1, encoder_causal=True, encoder_spatial_padding_mode="zeros",
                spatial_compression_ratio=8, temporal_compression_ratio=4)

CONFIGS = {
    "ltx2": dict(_ENCODER, decoder_block_out_channels=[16, 32], decoder_layers_per_block=[1, 1, 1],
                 decoder_spatio_temporal_scaling=[True, True], decoder_inject_noise=False,
                 upsample_type=["spatiotemporal", "spatiotemporal"], upsample_residual=True,
                 upsample_factor=[2, 2], timestep_conditioning=True, decoder_causal=False,
                 decoder_spatial_padding_mode="reflect", scaling_factor=0.7),
    "ltx23": dict(_ENCODER, decoder_block_out_channels=[24, 24, 32],
                  decoder_layers_per_block=[1, 0, 1, 1], decoder_spatio_temporal_scaling=True,
                  decoder_inject_noise=[False] * 4,
                  upsample_type=["spatiotemporal", "temporal", "spatial"],
                  upsample_residual=False, upsample_factor=[2, 1, 2], timestep_conditioning=False,
                  decoder_causal=False, decoder_spatial_padding_mode="zeros"),
}


def rel(a, b) -> float:
    """max |a - b| / max |b| (float64)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def make_ltx2_vae(cfg: dict, seed: int):
    """A diffusers ``AutoencoderKLLTX2Video`` with every tensor random (LayerNorm gains near 1,
    biases and tables non-zero, latent statistics not 0 / 1), in eval mode."""
    import torch
    from diffusers import AutoencoderKLLTX2Video

    torch.manual_seed(seed)
    model = AutoencoderKLLTX2Video(**cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("timestep_scale_multiplier"):
                p.fill_(250.0)
            elif "norm3" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("scale_shift_table"):
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
        c = model.latents_mean.numel()
        model.latents_mean.copy_(torch.linspace(-0.5, 0.5, c))
        model.latents_std.copy_(torch.linspace(0.5, 2.0, c))
    return model


def saved_pair(name: str, folder):
    """(diffusers model, ditax LTX2VideoVAE loaded from its ``save_pretrained`` folder)."""
    from ditax.models.vae.ltx2 import load_ltx2_video_vae

    ref = make_ltx2_vae(CONFIGS[name], seed=len(name))
    ref.save_pretrained(folder)
    return ref, load_ltx2_video_vae(folder)
