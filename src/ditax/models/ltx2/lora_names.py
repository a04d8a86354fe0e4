"""LTX-2's names for the LoRA machinery (:class:`~ditax.lora.names.LoraNames`).

Module names are the diffusers ``LTX2VideoTransformer3DModel`` names of :mod:`.convert`'s
table (``transformer_blocks.3.attn1.to_q``). The original names — Lightricks' ``ltx_core``
checkpoints and the LoRAs its trainer and ComfyUI write, ``diffusion_model.`` first — are the
same but for a few modules, which diffusers' ``_convert_non_diffusers_ltx2_lora_to_diffusers``
renames (:data:`ORIGINAL`): the input projections (``patchify_proj``), the timestep embedders
(``adaln_single``, ``av_ca_*_adaln_single``, ``prompt_adaln_single``), the a↔v tables
(``scale_shift_table_a2v_ca_*``) and the q / k norms (``q_norm``). So the formats read are
diffusers / PEFT (``transformer.transformer_blocks.0.attn1.to_q.lora_A.weight``), the original
form (``diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight`` or ``lora_down``) and
its kohya spelling (``lora_unet_transformer_blocks_0_attn1_to_q``); export writes the original
form, as the LTX-2 trainer saves its LoRAs. LoRAs on the text connectors (diffusers'
``connectors.`` / the original ``text_embedding_projection.`` keys) name no transformer layer
and are refused as keys that match none.

Target groups (``lora.targets``) are patterns over our module paths, both streams alike:
``self_attn`` the video and audio self-attentions (``attn1``, ``audio_attn1``), ``cross_attn``
the text cross-attentions and the audio↔video ones (``attn2``, ``audio_attn2``,
``audio_to_video_attn``, ``video_to_audio_attn``), ``attn`` both, ``ffn`` the two feed-forwards
(the LTX-2 trainer's default targets are the attentions' ``to_q / to_k / to_v / to_out.0``;
ditax's default ``attn,ffn`` adds the feed-forwards).
"""

from __future__ import annotations

import functools

from ditax.lora.names import LoraNames

#: diffusers name (one dotted segment) → the original (ltx_core) segment, where they differ
ORIGINAL = {
    "proj_in": "patchify_proj",
    "audio_proj_in": "audio_patchify_proj",
    "time_embed": "adaln_single",
    "audio_time_embed": "audio_adaln_single",
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
}

_SELF = r"transformer_blocks\.(attn1|audio_attn1)\..+"
_CROSS = r"transformer_blocks\.(attn2|audio_attn2|audio_to_video_attn|video_to_audio_attn)\..+"
_FFN = r"transformer_blocks\.(ff|audio_ff)\..+"
TARGETS = {"attn": (_SELF, _CROSS), "self_attn": (_SELF,), "cross_attn": (_CROSS,),
           "ffn": (_FFN,)}


@functools.lru_cache(maxsize=None)
def name_map():
    """The :class:`~ditax.models.common.name_map.NameMap` of every module (and parameter)
    name an LTX-2 / LTX-2.3 transformer can have: the weight table of a config with every
    optional part on (gates, text modulation with its sigma embedders, caption projections,
    keyframe embedding, affine norms), names without ``.weight`` / ``.bias``."""
    from ditax.models.common.name_map import NameMap, split_suffix
    from ditax.models.ltx2.config import LTX2Config
    from ditax.models.ltx2.convert import table

    every = LTX2Config(gated_attn=True, audio_gated_attn=True, cross_attn_mod=True,
                       audio_cross_attn_mod=True, use_prompt_adaln_single=True,
                       use_keyframes_abs_pos_embedding=True, norm_elementwise_affine=True)
    names = dict.fromkeys(split_suffix(r.key)[0] for r in table(every))   # ordered, unique
    names.update(dict.fromkeys(split_suffix(r.key)[0] for r in table(
        LTX2Config(use_prompt_embeddings=False))))
    pairs = tuple((".".join(ORIGINAL.get(p, p) for p in d.split(".")), d) for d in names)
    return NameMap(pairs)


def to_module(name: str, sep: str = ".") -> str | None:
    """An original name (``sep="_"``: kohya) → the diffusers module name; None: not LTX-2's."""
    return name_map().to_diffusers(name, sep)


def to_original(module: str) -> str | None:
    """A diffusers module name → the original (ltx_core) name."""
    return name_map().to_original(module)


def is_module(name: str) -> bool:
    """Whether ``name`` is a diffusers module (or parameter) name of the LTX-2 transformer."""
    return name_map().diffusers_pattern().fullmatch(name) is not None


LORA_NAMES = LoraNames(
    family="LTX-2",
    model="the LTX-2 transformer",
    to_module=to_module,
    to_original=to_original,
    is_module=is_module,
    original_prefixes=("model.diffusion_model.", "diffusion_model."),
    export_prefix="diffusion_model.",
    targets=TARGETS,
    description=("diffusers / PEFT (transformer.transformer_blocks.N.attn1.to_q.lora_A.weight), "
                 "original LTX-2 / ComfyUI (diffusion_model.transformer_blocks.N.attn1.to_q."
                 "lora_A.weight, or lora_down) or kohya "
                 "(lora_unet_transformer_blocks_N_attn1_to_q.lora_down.weight)"),
    mismatch_hint="is it a LoRA for another LTX model (LTX-2 vs LTX-2.3, or LTX-Video)?",
    layer_key=r"^transformer_blocks\.(\d+)\.",
)

__all__ = ["LORA_NAMES", "ORIGINAL", "TARGETS", "is_module", "name_map", "to_module",
           "to_original"]
