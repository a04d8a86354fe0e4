"""Tiny random diffusers VACE parts: a ``WanVACETransformer3DModel`` with every parameter
randomised (norm weights near 1) and a ``WanVACEPipeline`` around two of them (Wan 2.1 VAE
with z = 4: 2*4 + 64 control channels), saved in diffusers' format."""

from i2v_reference import Z, _scheduler, _vae21
from pipeline_reference import TEXT_DIM, make_text_parts

# the pipelines' transformer: 4 heads x 8, 2 blocks, hints after both
PIPELINE_ARCH = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=8,
                     in_channels=Z, out_channels=Z, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=48,
                     num_layers=2, vace_layers=[0, 1], vace_in_channels=2 * Z + 64)


def vace_transformer(seed, **arch):
    """A random ``WanVACETransformer3DModel`` of ``arch`` (default :data:`PIPELINE_ARCH`)."""
    import torch
    from diffusers import WanVACETransformer3DModel

    torch.manual_seed(seed)
    tr = WanVACETransformer3DModel(**(arch or PIPELINE_ARCH))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in tr.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / max(1, p.shape[-1]) ** 0.5)
                    + (1.0 if "norm" in name and name.endswith("weight") else 0.0))
    return tr.eval()


def make_tiny_vace(tmp_path, seed=0, two_experts=True, arch=None):
    """A tiny random ``WanVACEPipeline`` (two experts switching at t = 800: with 3 UniPC
    steps, t = 1000, 857 / 600; transformers of ``arch``, default :data:`PIPELINE_ARCH`),
    saved; returns (pipeline, folder)."""
    from diffusers import WanVACEPipeline

    tok, enc = make_text_parts(tmp_path, seed)
    extra = dict(transformer_2=vace_transformer(seed + 5, **(arch or {})), boundary_ratio=0.8) \
        if two_experts else {}
    pipe = WanVACEPipeline(tokenizer=tok, text_encoder=enc, vae=_vae21(seed + 2),
                           scheduler=_scheduler(),
                           transformer=vace_transformer(seed + 3, **(arch or {})),
                           **extra)
    pipe.set_progress_bar_config(disable=True)
    folder = tmp_path / "vace"
    pipe.save_pretrained(folder)
    return pipe, folder
