"""Tiny random diffusers ``Flux2Transformer2DModel`` models and inputs for parity tests."""

from __future__ import annotations

import numpy as np

#: diffusers' own test config of Flux2Transformer2DModel (tests/models/transformers/
#: test_models_transformer_flux2.py: 2 heads x 16, 4 rope axes of 4), with two blocks of each
#: kind so the scanned stacks have a layer axis > 1
TINY = dict(patch_size=1, in_channels=4, num_layers=2, num_single_layers=2,
            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
            timestep_guidance_channels=256, axes_dims_rope=[4, 4, 4, 4])
#: klein-like: no guidance embedding, out_channels != in_channels, another mlp ratio
KLEIN = dict(TINY, guidance_embeds=False, in_channels=8, out_channels=6, mlp_ratio=2.0)


def make_diffusers_flux2(tmp_path, seed: int = 0, name: str | None = None, **config):
    """A random ``Flux2Transformer2DModel`` (every tensor random, RMS-norm gains near 1) saved
    with save_pretrained; returns (model, folder)."""
    import torch
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(seed)
    m = Flux2Transformer2DModel(**config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for key, p in m.named_parameters():
            gain = 1.0 if ".norm" in key and p.ndim == 1 else 0.0
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / max(1, p.shape[-1]) ** 0.5) + gain)
    folder = tmp_path / (name or f"flux2_{seed}_{config.get('num_layers')}_"
                                 f"{config.get('guidance_embeds', True)}")
    m.save_pretrained(folder)
    return m, folder


def image_ids(h: int, w: int, t: int = 0) -> np.ndarray:
    """FLUX.2's image position ids ``(t, row, col, 0)`` of an ``h x w`` token grid."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    ids = np.stack([np.full_like(rows, t), rows, cols, np.zeros_like(rows)], -1)
    return ids.reshape(-1, 4).astype(np.float32)


def text_ids(n: int) -> np.ndarray:
    """FLUX.2's text position ids ``(0, 0, 0, token)``."""
    ids = np.zeros((n, 4), np.float32)
    ids[:, 3] = np.arange(n)
    return ids


def flux2_inputs(rng, config: dict, b: int = 2, grid=(4, 4), text: int = 7,
                 guidance: bool = True) -> dict:
    """Random inputs in diffusers' keyword names: packed tokens, text, t in [0, 1], the 4-axis
    position ids (3-D, as diffusers' pipelines pass them) and guidance when asked."""
    f32 = np.float32
    image = grid[0] * grid[1]
    out = dict(hidden_states=rng.standard_normal((b, image, config["in_channels"])).astype(f32),
               encoder_hidden_states=rng.standard_normal(
                   (b, text, config["joint_attention_dim"])).astype(f32),
               timestep=rng.uniform(0, 1, b).astype(f32),
               img_ids=np.broadcast_to(image_ids(*grid), (b, image, 4)).copy(),
               txt_ids=np.broadcast_to(text_ids(text), (b, text, 4)).copy())
    if guidance:
        # as FLUX.1's tests: guidance scales up to 2 keep the float32 sinusoid of 1000 x g
        # within the float32 level of the rest of the model
        out["guidance"] = rng.uniform(0.5, 2.0, b).astype(f32)
    return out


def run_diffusers_flux2(m, inputs: dict) -> np.ndarray:
    import torch

    with torch.no_grad():
        return m(**{k: torch.from_numpy(v) for k, v in inputs.items()},
                 return_dict=False)[0].numpy()


GRAD_INPUTS = ("hidden_states", "encoder_hidden_states")


def errors_vs_diffusers(m, tr, inputs: dict, rng) -> dict:
    """Relative errors of ditax's FLUX.2 ``tr`` against the diffusers model ``m`` on
    ``inputs``: the output, the gradients of a random cotangent's dot with it with respect to
    :data:`GRAD_INPUTS` and to every parameter (ditax's exported to diffusers' keys and
    layouts; the largest, ``"params"``)."""
    import torch

    from ditax.io.convert import export
    from ditax.models.flux2.convert import weight_table
    from shared_inputs import output_and_grads
    from wan_reference import rel_err

    ref = run_diffusers_flux2(m, inputs)
    ct = rng.standard_normal(ref.shape).astype(np.float32)

    out, grads = output_and_grads(tr, inputs, GRAD_INPUTS, ct)
    errs = {"out": rel_err(out, ref)}
    leaves = {k: torch.from_numpy(v).requires_grad_(k in GRAD_INPUTS) for k, v in inputs.items()}
    (m(**leaves, return_dict=False)[0] * torch.from_numpy(ct)).sum().backward()
    for name, g in zip(GRAD_INPUTS, grads[1:]):
        errs[name] = rel_err(g, leaves[name].grad.numpy())
    ours = export(weight_table(tr.config), grads[0]._state)     # diffusers keys and layouts
    theirs = {k: p.grad.numpy() for k, p in m.named_parameters()}
    m.zero_grad()
    assert set(ours) == set(theirs)
    errs["params"] = max(rel_err(ours[k], theirs[k]) for k in theirs)
    return errs
