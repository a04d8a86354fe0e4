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
form, as the LTX-2 trainer saves its LoRAs.

A file's keys for the text connectors — diffusers' ``connectors.`` (PEFT names of
``LTX2TextConnectors``) and the original ``text_embedding_projection.`` ones (its
``aggregate_embed`` is diffusers' ``text_proj_in``, as diffusers' LoRA loader renames it) —
are another component's (``LORA_NAMES.components``): the transformer's loader sets them aside
and ``ditax.load_pipeline`` merges them into the connectors with :data:`CONNECTOR_NAMES`
(:func:`connector_lora`); ``ditax.load_transformer`` alone logs that it left them.

Target groups (``lora.targets``) are patterns over our module paths, both streams alike:
``self_attn`` the video and audio self-attentions (``attn1``, ``audio_attn1``), ``cross_attn``
the text cross-attentions and the audio↔video ones (``attn2``, ``audio_attn2``,
``audio_to_video_attn``, ``video_to_audio_attn``), ``attn`` both, ``ffn`` the two feed-forwards
(the LTX-2 trainer's default targets are the attentions' ``to_q / to_k / to_v / to_out.0``;
ditax's default ``attn,ffn`` adds the feed-forwards).
"""

from __future__ import annotations

import functools
import re

from ditax.lora.names import LoraNames
from ditax.models.common.name_map import original_lora_names

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
    from ditax.models.ltx2.transformer.convert import table

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


LORA_NAMES = original_lora_names(
    to_module, to_original, is_module, family="LTX-2", model="the LTX-2 transformer",
    targets=TARGETS, layer_key=r"^transformer_blocks\.(\d+)\.",
    components={"connectors.": "connectors", "text_embedding_projection.": "connectors"},
    description=("diffusers / PEFT (transformer.transformer_blocks.N.attn1.to_q.lora_A.weight), "
                 "original LTX-2 / ComfyUI (diffusion_model.transformer_blocks.N.attn1.to_q."
                 "lora_A.weight, or lora_down) or kohya "
                 "(lora_unet_transformer_blocks_N_attn1_to_q.lora_down.weight)"),
    mismatch_hint="is it a LoRA for another LTX model (LTX-2 vs LTX-2.3, or LTX-Video)?")

#: the original (ltx_core) connector projection's name → diffusers' (per-modality LTX-2.3
#: projections included: ``video_aggregate_embed`` → ``video_text_proj_in``)
_CONNECTOR_ORIGINAL = ("aggregate_embed", "text_proj_in")


#: every module name of ``LTX2TextConnectors`` (:mod:`.connectors_load`'s table, both
#: projection layouts, any layer count)
_CONNECTOR_MODULE = re.compile(
    r"(?:video_|audio_)?text_proj_in|(?:video|audio)_connector\.(?:learnable_registers|"
    r"transformer_blocks\.\d+\.(?:attn1\.(?:to_[qkv]|to_out\.0|to_gate_logits|norm_[qk])|"
    r"ff\.net\.(?:0\.proj|2)))")


def is_connector_module(name: str) -> bool:
    """Whether ``name`` is a module name of the LTX-2 text connectors (diffusers' names)."""
    return _CONNECTOR_MODULE.fullmatch(name) is not None


def _connector_module(name: str, sep: str = ".") -> str | None:
    if sep != ".":
        return None
    name = name.replace(*_CONNECTOR_ORIGINAL)
    return name if is_connector_module(name) else None


CONNECTOR_NAMES = LoraNames(
    family="LTX-2 connector",
    model="the LTX-2 text connectors",
    to_module=_connector_module,
    to_original=lambda m: m.replace(_CONNECTOR_ORIGINAL[1], _CONNECTOR_ORIGINAL[0]),
    is_module=is_connector_module,
    original_prefixes=("text_embedding_projection.",),
    export_prefix="text_embedding_projection.",
    description=("diffusers / PEFT (connectors.video_connector.transformer_blocks.N.attn1.to_q."
                 "lora_A.weight) or original (text_embedding_projection.aggregate_embed."
                 "lora_A.weight)"),
    mismatch_hint="is it a LoRA for another LTX model (LTX-2 vs LTX-2.3)?",
    layer_key=r"^(?:video|audio)_connector\.transformer_blocks\.(\d+)\.",
)


def connector_lora(loras) -> list:
    """``[(Lora, strength)]`` of the transformer's LoRAs → ``[(Lora, strength)]`` of their
    connector keys (:attr:`~ditax.lora.table.Lora.components` ``"connectors"``) parsed with
    :data:`CONNECTOR_NAMES` (diffusers' ``connectors.`` prefix read as PEFT's
    ``transformer.``, so the file's PEFT scale metadata applies); the files without such keys
    left out."""
    from ditax.lora.table import parse_lora

    out = []
    for lora, strength in loras:
        keys = lora.components.get("connectors")
        if keys:
            tensors = {("transformer." + k.removeprefix("connectors.")
                        if k.startswith("connectors.") else k): v for k, v in keys.items()}
            out.append((parse_lora(tensors, lora.metadata, f"{lora.source} (connectors)",
                                   names=CONNECTOR_NAMES), strength))
    return out

__all__ = ["CONNECTOR_NAMES", "LORA_NAMES", "ORIGINAL", "TARGETS", "connector_lora",
           "is_connector_module", "is_module", "name_map", "to_module", "to_original"]
