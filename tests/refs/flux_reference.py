"""Tiny random diffusers ``FluxTransformer2DModel`` models and inputs for parity tests."""

from __future__ import annotations

import numpy as np

#: diffusers' own test config of FluxTransformer2DModel: 2 heads x 16, one block of each kind
TINY = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
            pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
#: a larger one: guidance embedding (FLUX.1-dev's), two blocks of each kind, 8 output channels
DEV = dict(TINY, num_layers=2, num_single_layers=2, guidance_embeds=True, in_channels=8,
           out_channels=6)


def make_diffusers_flux(tmp_path, seed: int = 0, name: str | None = None, **config):
    """A random ``FluxTransformer2DModel`` (every tensor random, norm gains near 1) saved with
    save_pretrained; returns (model, folder)."""
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    m = FluxTransformer2DModel(**config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for key, p in m.named_parameters():
            gain = 1.0 if ".norm" in key and p.ndim == 1 else 0.0
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / max(1, p.shape[-1]) ** 0.5) + gain)
    folder = tmp_path / (name or f"flux_{seed}_{config.get('num_attention_heads')}"
                                 f"_{config.get('num_layers')}")
    m.save_pretrained(folder)
    return m, folder


def flux_inputs(rng, config: dict, b: int = 2, image: int = 16, text: int = 7,
                guidance: bool = False) -> dict:
    """Random inputs in diffusers' keyword names: packed tokens, text, pooled, t in [0, 1],
    position ids (floats, as diffusers' tests use) and guidance when the model embeds it."""
    f32 = np.float32
    out = dict(hidden_states=rng.standard_normal((b, image, config["in_channels"])).astype(f32),
               encoder_hidden_states=rng.standard_normal(
                   (b, text, config["joint_attention_dim"])).astype(f32),
               pooled_projections=rng.standard_normal(
                   (b, config["pooled_projection_dim"])).astype(f32),
               timestep=rng.uniform(0, 1, b).astype(f32),
               img_ids=(rng.standard_normal((image, 3)) * 4).astype(f32),
               txt_ids=rng.standard_normal((text, 3)).astype(f32))
    if guidance:
        # the model embeds 1000 x guidance as a float32 sinusoid; jax's and torch's float32
        # frequency tables differ by an ulp in a few entries, which at g = 5 (5000 rad) is
        # ~1e-5 in the guidance embedder's gradient: scales up to 2 keep the comparison at
        # the float32 level of the rest of the model
        out["guidance"] = rng.uniform(0.5, 2.0, b).astype(f32)
    return out


def run_diffusers_flux(m, inputs: dict) -> np.ndarray:
    import torch

    with torch.no_grad():
        return m(**{k: torch.from_numpy(v) for k, v in inputs.items()},
                 return_dict=False)[0].numpy()

