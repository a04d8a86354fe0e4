"""Helpers that build tiny random diffusers Wan transformers for parity tests."""

from __future__ import annotations

import numpy as np


def make_diffusers_wan(tmp_path, *, heads=2, head_dim=16, layers=2, ffn=64, text_dim=32,
                       freq_dim=32, in_ch=4, out_ch=None, cross_attn_norm=True, seed=0,
                       patch=(1, 2, 2), **config):
    """A random ``WanTransformer3DModel`` saved with save_pretrained; returns (model, folder).
    ``config``: more constructor arguments (image-to-video: ``image_dim``, ...)."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    m = WanTransformer3DModel(
        patch_size=patch, num_attention_heads=heads, attention_head_dim=head_dim,
        in_channels=in_ch, out_channels=out_ch or in_ch, text_dim=text_dim, freq_dim=freq_dim,
        ffn_dim=ffn, num_layers=layers, cross_attn_norm=cross_attn_norm, rope_max_seq_len=1024,
        **config)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            # randomise everything (norm gains and biases too) so a wrong mapping shows
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / max(1, p.shape[-1]) ** 0.5)
                    + (1.0 if name.endswith("norm_q.weight") or name.endswith("norm_k.weight")
                       else 0.0))
    m.eval()
    folder = tmp_path / f"wan_h{heads}_k{head_dim}_l{layers}_{seed}"
    m.save_pretrained(folder)
    return m, folder


def run_diffusers(m, latents, t, text):
    import torch

    with torch.no_grad():
        out = m(torch.from_numpy(np.asarray(latents)), torch.from_numpy(np.asarray(t)),
                torch.from_numpy(np.asarray(text)), return_dict=False)[0]
    return out.numpy()


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
