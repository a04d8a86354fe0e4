"""Wan's names for the LoRA machinery (:class:`~ditax.lora.names.LoraNames`).

Module names are the diffusers ``WanTransformer3DModel`` names of :mod:`.convert`'s table;
original names (Wan / ComfyUI, musubi-tuner) map to them through :mod:`.original_names`.
The fine-tuning target groups (``lora.targets``) are patterns over our module paths: the
stacked blocks' ``attn1`` (self-attention), ``attn2`` (cross-attention, image K/V included)
and ``ffn`` Linear layers. A VACE transformer's LoRA names its VACE blocks
``vace_blocks.N.…`` (diffusers / PEFT naming only; original Wan names for them are not read);
an Animate transformer's adds the modules of its own that PEFT can wrap (Linear / Conv):
``face_adapter.N.to_q|to_k|to_v|to_out``, ``face_encoder.out_proj|conv1_local|conv2|conv3``
and ``pose_patch_embedding`` (the motion encoder's layers are custom modules PEFT does not
wrap, so no LoRA names them).
"""

from __future__ import annotations

import re

from ditax.models.common.name_map import original_lora_names
from ditax.models.wan.original_names import NAME_MAP, to_diffusers, to_original

_SELF, _CROSS, _FFN = r"blocks\.attn1\..+", r"blocks\.attn2\..+", r"blocks\.ffn\..+"
TARGETS = {"attn": (_SELF, _CROSS), "self_attn": (_SELF,), "cross_attn": (_CROSS,),
           "ffn": (_FFN,)}


#: the VACE transformer's blocks (``WanVACETransformer3DModel.vace_blocks``): a Wan block's
#: modules, plus block 0's ``proj_in`` and every block's ``proj_out``
_VACE_BLOCK = re.compile(r"vace_(blocks\.\d+\..+)")
_VACE_PROJ = re.compile(r"blocks\.\d+\.proj_(in|out)")
#: the Animate transformer's own LoRA-able modules (``WanAnimateTransformer3DModel``)
_ANIMATE = re.compile(r"face_adapter\.\d+\.to_(q|k|v|out)|face_encoder\.(out_proj|conv1_local"
                      r"|conv2|conv3)|pose_patch_embedding")


def is_module(name: str) -> bool:
    """Whether ``name`` is a diffusers module (or bare parameter) name of the Wan transformer
    (the VACE transformer's ``vace_blocks.N.*`` and the Animate one's modules included)."""
    if _ANIMATE.fullmatch(name):
        return True
    vace = _VACE_BLOCK.fullmatch(name)
    if vace is not None:
        return _VACE_PROJ.fullmatch(vace[1]) is not None or is_module(vace[1])
    return NAME_MAP.diffusers_pattern().fullmatch(name) is not None


LORA_NAMES = original_lora_names(
    to_diffusers, to_original, is_module, family="Wan", model="the Wan transformer",
    targets=TARGETS, layer_key=r"^blocks\.(\d+)\.",
    description=("original Wan / ComfyUI (diffusion_model.blocks.N.self_attn.q.lora_down.weight), "
                 "musubi-tuner / kohya (lora_unet_blocks_N_self_attn_q.lora_down.weight) or "
                 "diffusers / PEFT (transformer.blocks.N.attn1.to_q.lora_A.weight)"),
    mismatch_hint="is it a LoRA for another Wan model (size, text- vs image-to-video)?")

__all__ = ["LORA_NAMES", "TARGETS", "is_module"]
