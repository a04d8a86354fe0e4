"""Tiny random diffusers ``AutoencoderKL`` models (the Flux VAE's reference) for parity tests."""

from __future__ import annotations

import numpy as np

#: two levels (2x spatial), one resnet a level, 4 groups; tiles of 16 px = 8 latent px
TINY = dict(block_out_channels=[8, 16], layers_per_block=1, norm_num_groups=4, latent_channels=16,
            down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
            sample_size=16, scaling_factor=0.3611, shift_factor=0.1159)
CONFIGS = {"flux": dict(TINY, use_quant_conv=False, use_post_quant_conv=False),
           "sd": dict(TINY, latent_channels=4, shift_factor=None)}   # quant convs (the default)


def rel(a, b) -> float:
    """max |a - b| / max |b| (float64)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def make_autoencoder_kl(cfg: dict, seed: int):
    """A diffusers ``AutoencoderKL`` with every tensor random (norm gains near 1, biases
    non-zero), in eval mode."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    model = AutoencoderKL(**cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
    return model


def saved_pair(name: str, folder):
    """(diffusers model, ditax FluxVAE loaded from its save_pretrained folder) of ``CONFIGS[name]``."""
    from ditax.models.vae.kl import load_vae

    ref = make_autoencoder_kl(CONFIGS[name], seed=len(name))
    ref.save_pretrained(folder)
    return ref, load_vae(folder)
