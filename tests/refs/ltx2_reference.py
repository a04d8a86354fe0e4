"""Tiny random diffusers ``LTX2VideoTransformer3DModel`` models and inputs for parity tests."""

from __future__ import annotations

import numpy as np

#: LTX-2-like: split RoPE (padded tables), caption projections, no gates; 2 heads x 8 video,
#: 2 heads x 8 audio, two blocks; perturbed-attention processors (for STG)
LTX2 = dict(in_channels=4, out_channels=6, num_attention_heads=2, attention_head_dim=8,
            cross_attention_dim=16, audio_in_channels=4, audio_out_channels=3,
            audio_num_attention_heads=2, audio_attention_head_dim=8,
            audio_cross_attention_dim=16, num_layers=2, caption_channels=12,
            rope_type="split", rope_double_precision=True, perturbed_attn=True)
#: LTX-2.3-like: gated attention and text modulation in both streams (the static prompt
#: tables: use_prompt_adaln_single=False), connector-width text, perturbed-attention
#: processors, no video feed-forward biases, keyframe embedding, interleaved RoPE
LTX23 = dict(LTX2, gated_attn=True, audio_gated_attn=True, cross_attn_mod=True,
             audio_cross_attn_mod=True, use_prompt_embeddings=False, perturbed_attn=True,
             use_prompt_adaln_single=False, ff_bias=False, rope_type="interleaved",
             use_keyframes_abs_pos_embedding=True, pos_embed_max_pos=24)
#: for meshes: LTX-2.3-like with 4 video heads (Ulysses over 4 context shards; the split
#: RoPE of the audio<->video attentions then groups their 2 audio heads' channels in 4),
#: sigma-dependent text modulation (use_prompt_adaln_single)
PAR = dict(LTX23, num_attention_heads=4, cross_attention_dim=32, use_prompt_adaln_single=True,
           rope_type="split", ff_bias=True)


def make_diffusers_ltx2(tmp_path, seed: int = 0, name: str | None = None, **config):
    """A random ``LTX2VideoTransformer3DModel`` (every tensor random, norm gains near 1)
    saved with save_pretrained; returns (model, folder)."""
    import torch
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(seed)
    m = LTX2VideoTransformer3DModel(**config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for key, p in m.named_parameters():
            gain = 1.0 if ".norm" in key and p.ndim == 1 else 0.0
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / max(1, p.shape[-1]) ** 0.5) + gain)
    folder = tmp_path / (name or f"ltx2_{seed}_{config.get('num_attention_heads')}")
    m.save_pretrained(folder)
    return m, folder


def ltx2_inputs(rng, config: dict, b: int = 2, frames: int = 2, height: int = 3,
                width: int = 3, audio: int = 5, text: int = 6, audio_text: int = 4,
                per_token: bool = False) -> dict:
    """Random inputs in diffusers' keyword names: packed video and audio tokens, the two
    texts with masks (sample 0's last text tokens masked), timesteps in [0, 1000] (one per
    video token with ``per_token``), sizes and an fps of 25."""
    f32 = np.float32
    c = {"use_prompt_embeddings": True, "caption_channels": 3840, **config}
    width_v = c["caption_channels"] if c["use_prompt_embeddings"] else c["cross_attention_dim"]
    width_a = (c["caption_channels"] if c["use_prompt_embeddings"]
               else c["audio_cross_attention_dim"])
    seq = frames * height * width
    mask = np.ones((b, text), f32)
    mask[0, text - 2:] = 0
    audio_mask = np.ones((b, audio_text), f32)
    audio_mask[0, audio_text - 1:] = 0
    out = dict(
        hidden_states=rng.standard_normal((b, seq, c["in_channels"])).astype(f32),
        audio_hidden_states=rng.standard_normal((b, audio, c["audio_in_channels"])).astype(f32),
        encoder_hidden_states=rng.standard_normal((b, text, width_v)).astype(f32),
        audio_encoder_hidden_states=rng.standard_normal((b, audio_text, width_a)).astype(f32),
        timestep=rng.uniform(0, 1000, (b, seq) if per_token else b).astype(f32),
        encoder_attention_mask=mask, audio_encoder_attention_mask=audio_mask,
        num_frames=frames, height=height, width=width, audio_num_frames=audio, fps=25.0)
    if per_token:
        out["audio_timestep"] = rng.uniform(0, 1000, b).astype(f32)
    return out


def run_diffusers_ltx2(m, inputs: dict):
    """(video, audio) outputs of the torch model (numpy)."""
    import torch

    with torch.no_grad():
        v, a = m(**{k: torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                    for k, x in inputs.items()}, return_dict=False)
    return v.numpy(), a.numpy()


__all__ = ["LTX2", "LTX23", "PAR", "make_diffusers_ltx2", "ltx2_inputs", "run_diffusers_ltx2"]
