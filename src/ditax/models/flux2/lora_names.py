"""FLUX.2's names for the LoRA machinery (:class:`~ditax.lora.names.LoraNames`).

Module names are the diffusers ``Flux2Transformer2DModel`` names of :mod:`.convert`'s table
(diffusers / PEFT files: ``transformer.transformer_blocks.0.attn.to_q.lora_A.weight``). BFL's
names (ai-toolkit / ComfyUI ``diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight``,
or ``lora_down`` / ``lora_up``) and kohya's (``lora_unet_double_blocks_0_img_attn_qkv``) map
to them through :mod:`.original_names` (the fused double-block q / k / v split into their
diffusers layers), the names diffusers' ``_convert_non_diffusers_flux2_lora_to_diffusers``
uses. Export writes kohya names (``lora_unet_`` + BFL names with ``_``).

Target groups (``lora.targets``) are patterns over our module paths: ``attn`` every attention
projection of both block kinds (the single blocks' fused ``to_qkv_mlp_proj`` / ``to_out``
also carry the MLP, so they are in both groups), ``ffn`` the MLPs.
"""

from __future__ import annotations

from ditax.models.flux2.original_names import NAMES

_DOUBLE_ATTN = (r"transformer_blocks\.attn\.(to_q|to_k|to_v|to_out|add_q_proj|add_k_proj|"
                r"add_v_proj|to_add_out)")
_SINGLE = r"single_transformer_blocks\.attn\.(to_qkv_mlp_proj|to_out)"
_FFN = (r"transformer_blocks\.(ff|ff_context)\.(linear_in|linear_out)", _SINGLE)
TARGETS = {"attn": (_DOUBLE_ATTN, _SINGLE), "ffn": _FFN}

LORA_NAMES = NAMES.lora_names(
    "FLUX.2", TARGETS, "is it a LoRA for another FLUX.2 model size (klein 4B / 9B, dev), or "
    "for FLUX.1?", "BFL / ai-toolkit / ComfyUI (diffusion_model.double_blocks.N.img_attn.qkv."
    "lora_A.weight) or kohya (lora_unet_double_blocks_N_img_attn_qkv.lora_down.weight)")

__all__ = ["LORA_NAMES", "TARGETS"]
