"""Lightricks' original LTX-2 names ↔ diffusers ``LTX2VideoTransformer3DModel`` names.

The original checkpoints (``ltx-2-19b-dev.safetensors`` and kin, written by ``ltx_core``) hold
the whole audio+video model in one file, each part under its own prefix:

- ``model.diffusion_model.``: the transformer, and beside it the text connectors
  (``video_embeddings_connector.``, ``audio_embeddings_connector.``,
  ``text_embedding_projection.``; some files keep the projection outside the prefix);
- ``vae.``: the video VAE; ``audio_vae.``: the audio VAE; ``vocoder.``: the vocoder.

The transformer's names are diffusers' but for whole dotted segments (diffusers'
``convert_ltx2_to_diffusers.py``): ``patchify_proj`` for ``proj_in``, ``adaln_single`` for
``time_embed``, ``av_ca_*_adaln_single`` for the a↔v modulation embedders,
``scale_shift_table_a2v_ca_*`` for the blocks' a↔v tables, ``q_norm`` / ``k_norm`` for
``norm_q`` / ``norm_k``, LTX-2.3's ``prompt_adaln_single``. That one segment table is the
LoRA names' (:data:`ditax.models.ltx2.lora_names.ORIGINAL`); here it renames full tensor keys
both ways, and :data:`OTHER_PARTS` / :data:`CONNECTOR_PARTS` name what else a file may hold.
"""

from __future__ import annotations

from ditax.models.ltx2.lora_names import ORIGINAL

#: the transformer's prefix in an original whole-model file (ComfyUI: ``diffusion_model.``)
PREFIXES = ("model.diffusion_model.", "diffusion_model.")

#: the text connectors, beside the transformer under its prefix (not transformer weights)
CONNECTOR_PARTS = ("video_embeddings_connector", "audio_embeddings_connector",
                   "transformer_1d_blocks", "text_embedding_projection", "connectors")

#: the whole file's other parts, by their top-level prefix (what they are, for messages)
OTHER_PARTS = {"vae": "video VAE", "audio_vae": "audio VAE", "vocoder": "vocoder",
               "text_embedding_projection": "text connectors' projection",
               "duration_head": "duration head"}

_TO_DIFFUSERS = {o: d for d, o in ORIGINAL.items()}


def key_to_original(key: str) -> str:
    """A diffusers tensor key → its original name (``time_embed.linear.weight`` →
    ``adaln_single.linear.weight``); segments the table lacks stay as they are."""
    return ".".join(ORIGINAL.get(p, p) for p in key.split("."))


def key_to_diffusers(key: str) -> str:
    """An original tensor key (without the file's prefix) → the diffusers one."""
    return ".".join(_TO_DIFFUSERS.get(p, p) for p in key.split("."))


def is_original(keys, prefix: str = "") -> bool:
    """Whether the transformer keys (those under ``prefix``) use the original names: one of
    them has a segment only an original name has (``patchify_proj``, ``adaln_single`` …)."""
    return any(p in _TO_DIFFUSERS for k in keys if k.startswith(prefix)
               for p in k[len(prefix):].split("."))


__all__ = ["CONNECTOR_PARTS", "OTHER_PARTS", "PREFIXES", "is_original", "key_to_diffusers",
           "key_to_original"]
