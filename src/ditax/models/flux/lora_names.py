"""FLUX.1's names for the LoRA machinery (:class:`~ditax.lora.names.LoraNames`).

Module names are the diffusers ``FluxTransformer2DModel`` names of :mod:`.convert`'s table;
BFL's names (ComfyUI ``diffusion_model.double_blocks.0.img_attn.qkv.lora_down.weight``), kohya
sd-scripts' (``lora_unet_double_blocks_0_img_attn_qkv``) and XLabs'
(``double_blocks.0.processor.qkv_lora1.down.weight``) map to them through
:mod:`.original_names`, whose fused layers (q / k / v in one, ``linear1``'s q / k / v / MLP,
the final modulation's swapped halves) are split into their diffusers layers; kohya files in
diffusers names (``lora_transformer_transformer_blocks_0_attn_to_q``) read back through
:meth:`~ditax.models.common.bfl.names.BflNames.from_underscored`. Export writes
kohya names (``lora_unet_`` + BFL names with ``_``), the fused layers assembled again.

Target groups (``lora.targets``) are patterns over our module paths: ``attn`` every attention
projection of both block kinds, ``ffn`` the MLPs (the double blocks' two and the single
blocks' ``proj_mlp``; ``proj_out`` reads attention and MLP, so it is in both groups).
"""

from __future__ import annotations

from ditax.models.flux.original_names import NAMES

_DOUBLE_ATTN = (r"transformer_blocks\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|"
                r"add_v_proj|to_add_out)")
_SINGLE_ATTN = r"single_transformer_blocks\.(attn\.(to_q|to_k|to_v)|proj_out)"
_FFN = (r"transformer_blocks\.(ff|ff_context)\.(proj_in|proj_out)",
        r"single_transformer_blocks\.(proj_mlp|proj_out)")
TARGETS = {"attn": (_DOUBLE_ATTN, _SINGLE_ATTN), "ffn": _FFN}

LORA_NAMES = NAMES.lora_names(
    "Flux", TARGETS, "is it a LoRA for another FLUX.1 model size, or for FLUX.2?",
    "kohya (lora_unet_double_blocks_N_img_attn_qkv.lora_down.weight, or "
    "lora_transformer_transformer_blocks_N_attn_to_q.lora_down.weight), BFL / ComfyUI "
    "(diffusion_model.double_blocks.N.img_attn.qkv.lora_down.weight) or XLabs "
    "(double_blocks.N.processor.qkv_lora1.down.weight)")

__all__ = ["LORA_NAMES", "TARGETS"]
