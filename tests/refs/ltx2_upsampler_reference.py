"""Tiny random diffusers ``LTX2LatentUpsamplerModel`` models and ``LTX2LatentUpsamplePipeline``
folders (saved with ``save_pretrained``), for parity with :mod:`ditax.models.ltx2.upsampler` and
:mod:`ditax.pipelines.ltx2.upsample`."""

from __future__ import annotations

import numpy as np

#: 8 latent channels (the tiny LTX-2 VAE's), 32-wide middle (one GroupNorm group a channel),
#: one residual block a stage; the variants diffusers builds
TINY = dict(in_channels=8, mid_channels=32, num_blocks_per_stage=1, dims=3)
VARIANTS = {
    "rational_2x": dict(TINY),                                   # LTX-2's: blur skipped
    "rational_1.5x": dict(TINY, rational_spatial_scale=1.5),     # x3 then blur stride 2
    "shuffle_2x_2d": dict(TINY, dims=2, use_rational_resampler=False),
    "spatiotemporal": dict(TINY, temporal_upsample=True),
    "temporal": dict(TINY, spatial_upsample=False, temporal_upsample=True),
}


def make_upsampler(config: dict, seed: int = 0):
    """A diffusers ``LTX2LatentUpsamplerModel`` with every parameter random (GroupNorm gains
    near 1, biases non-zero; the blur kernel as diffusers builds it), in eval mode."""
    import torch
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    model = LTX2LatentUpsamplerModel(**config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * r)
            elif p.ndim == 1:
                p.copy_(0.2 * r)
            else:
                p.copy_(r / p[0].numel() ** 0.5)
    return model.eval()


def write_upsampler(root, config: dict, seed: int = 0):
    """Save :func:`make_upsampler`'s model at ``root``; returns it."""
    model = make_upsampler(config, seed)
    model.save_pretrained(root)
    return model


def write_upsample_pipeline(root, vae, config: dict | None = None, seed: int = 0):
    """Write an ``LTX2LatentUpsamplePipeline`` folder (``latent_upsampler/`` + ``vae/``) at
    ``root`` around ``vae``; returns the diffusers pipeline."""
    from diffusers import LTX2LatentUpsamplePipeline

    pipe = LTX2LatentUpsamplePipeline(vae=vae, latent_upsampler=make_upsampler(
        config or VARIANTS["rational_2x"], seed))
    pipe.save_pretrained(root)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_upsampler(model, latents: np.ndarray) -> np.ndarray:
    """diffusers' upsampled latents (numpy) of ``latents`` ``[B, C, F, Y, X]``."""
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(latents)).numpy()


__all__ = ["TINY", "VARIANTS", "make_upsampler", "run_upsampler", "write_upsample_pipeline",
           "write_upsampler"]
