"""Original (Lightricks) LTX-2 single files for tests, written from a diffusers transformer.

The key map is diffusers' ``scripts/convert_ltx2_to_diffusers.py`` (original → diffusers: whole
segments renamed, ``adaln_single.`` → ``time_embed.`` at the top), written here the other way
round and independently of :mod:`ditax.models.ltx2.original_names`, so a wrong table there
fails the parity test instead of agreeing with itself. The file holds what an original
whole-model checkpoint holds besides the transformer: text connectors under the transformer's
prefix, a projection outside it, and small stand-ins for the VAEs and the vocoder.
"""

from __future__ import annotations

import numpy as np

#: diffusers segment → original segment (the script's rename table, inverted)
TO_ORIGINAL = {
    "proj_in": "patchify_proj",
    "audio_proj_in": "audio_patchify_proj",
    "av_cross_attn_video_scale_shift": "av_ca_video_scale_shift_adaln_single",
    "av_cross_attn_video_a2v_gate": "av_ca_a2v_gate_adaln_single",
    "av_cross_attn_audio_scale_shift": "av_ca_audio_scale_shift_adaln_single",
    "av_cross_attn_audio_v2a_gate": "av_ca_v2a_gate_adaln_single",
    "video_a2v_cross_attn_scale_shift_table": "scale_shift_table_a2v_ca_video",
    "audio_a2v_cross_attn_scale_shift_table": "scale_shift_table_a2v_ca_audio",
    "norm_q": "q_norm",
    "norm_k": "k_norm",
    "prompt_adaln": "prompt_adaln_single",
    "audio_prompt_adaln": "audio_prompt_adaln_single",
    "time_embed": "adaln_single",
    "audio_time_embed": "audio_adaln_single",
}

PREFIX = "model.diffusion_model."


def original_key(key: str) -> str:
    """A diffusers transformer key → the original checkpoint's, with the transformer prefix."""
    return PREFIX + ".".join(TO_ORIGINAL.get(p, p) for p in key.split("."))


def other_parts(rng) -> dict[str, np.ndarray]:
    """Stand-ins for the rest of a whole-model file (connectors, VAEs, vocoder)."""
    t = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return {
        PREFIX + "video_embeddings_connector.transformer_1d_blocks.0.attn1.to_q.weight": t(4, 4),
        PREFIX + "audio_embeddings_connector.learnable_registers": t(2, 4),
        "text_embedding_projection.aggregate_embed.weight": t(4, 8),
        "vae.decoder.conv_in.conv.weight": t(4, 4, 3, 3, 3),
        "vae.per_channel_statistics.mean-of-means": t(4),
        "audio_vae.decoder.conv_in.conv.weight": t(4, 2, 3, 3),
        "vocoder.conv_pre.weight": t(8, 4, 7),
    }


def write_original(model, path, seed: int = 0, drop=(), extra=None) -> dict[str, np.ndarray]:
    """Write the torch ``LTX2VideoTransformer3DModel`` ``model`` as an original whole-model
    file at ``path`` (its keys renamed, :func:`other_parts` beside), leaving out the original
    keys ``drop`` and adding ``extra`` (key → array); returns the tensors written."""
    from safetensors.numpy import save_file

    tensors = {original_key(k): v.detach().numpy().copy() for k, v in model.state_dict().items()}
    tensors.update(other_parts(np.random.default_rng(seed)))
    for k in drop:
        del tensors[k]
    tensors.update(extra or {})
    save_file(tensors, str(path))
    return tensors


__all__ = ["PREFIX", "TO_ORIGINAL", "original_key", "other_parts", "write_original"]
