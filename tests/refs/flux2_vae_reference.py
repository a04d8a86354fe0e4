"""A tiny random diffusers ``AutoencoderKLFlux2`` (FLUX.2's VAE) for parity tests, and the
FLUX.2 pipelines' latent normalisation written from their code, in torch."""

from __future__ import annotations

import numpy as np

#: two levels (2x spatial), one resnet a level, 4 groups, a decoder wider than the encoder,
#: 8 latent channels (a 32-channel BatchNorm over 2x2 patches), an eps that matters; tiles of
#: 16 px = 8 latent px
TINY = dict(block_out_channels=[8, 16], decoder_block_out_channels=[12, 20], layers_per_block=1,
            norm_num_groups=4, latent_channels=8, down_block_types=["DownEncoderBlock2D"] * 2,
            up_block_types=["UpDecoderBlock2D"] * 2, sample_size=16, batch_norm_eps=0.05)


def rel_err(a, b) -> float:
    """||a - b|| / ||b|` (float64), as tests/refs/wan_reference.py."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def make_flux2_vae(cfg: dict = TINY, seed: int = 0):
    """A diffusers ``AutoencoderKLFlux2`` with every tensor random (norm gains near 1, biases
    non-zero, BatchNorm running mean / variance away from 0 / 1), in eval mode."""
    import torch
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(seed)
    model = AutoencoderKLFlux2(**cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
        model.bn.running_mean.copy_(0.5 * torch.randn_like(model.bn.running_mean))
        model.bn.running_var.copy_(0.2 + 2.0 * torch.rand_like(model.bn.running_var))
        model.bn.num_batches_tracked.fill_(7)
    return model


def pipeline_normalize(vae, image_latents):
    """The FLUX.2 pipelines' ``_encode_vae_image`` after the VAE: patchify (their static
    ``_patchify_latents``), then ``(z - running_mean) / sqrt(running_var + eps)``."""
    import torch
    from diffusers import Flux2Pipeline

    z = Flux2Pipeline._patchify_latents(image_latents)
    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(z.dtype)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(z.dtype)
    return (z - mean) / std


def pipeline_denormalize(vae, latents):
    """The FLUX.2 pipelines before ``vae.decode``: ``z * sqrt(running_var + eps) +
    running_mean``, then unpatchify (``Flux2KleinPipeline._unpatchify_latents``)."""
    import torch
    from diffusers import Flux2KleinPipeline

    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(latents.dtype)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(
        latents.dtype)
    return Flux2KleinPipeline._unpatchify_latents(latents * std + mean)


def saved_pair(folder, cfg: dict = TINY, seed: int = 0):
    """(diffusers model, ditax Flux2VAE loaded from its ``save_pretrained`` folder)."""
    from ditax.models.vae.flux2 import load_flux2_vae

    ref = make_flux2_vae(cfg, seed)
    ref.save_pretrained(folder)
    return ref, load_flux2_vae(folder)
