"""BFL's original FLUX.1 names ↔ diffusers ``FluxTransformer2DModel`` names: one table.

BFL's checkpoints (``flux1-dev.safetensors``, ComfyUI with ``model.diffusion_model.`` /
``diffusion_model.``) and the LoRA trainers that follow them (kohya sd-scripts
``lora_unet_double_blocks_0_img_attn_qkv``, XLabs ``double_blocks.0.processor.qkv_lora1``)
name the modules differently, and some BFL layers are several diffusers layers in one:

- ``double_blocks.N.img_attn.qkv`` = ``attn.to_q``, ``to_k``, ``to_v`` stacked along the output
  (``txt_attn.qkv``: ``add_q_proj``, ``add_k_proj``, ``add_v_proj``);
- ``single_blocks.N.linear1`` = ``attn.to_q``, ``to_k``, ``to_v`` (D rows each) and
  ``proj_mlp`` (4·D rows);
- ``final_layer.adaLN_modulation.1`` = ``norm_out.linear`` with its two halves swapped (BFL
  computes ``shift, scale``, diffusers ``scale, shift``).

The table lists the one-to-one names and :data:`FUSED` the fused layers as *pieces*
``(diffusers module, start, stop)``; :data:`NAMES` reads it both ways as FLUX.2's table is read
(:class:`~ditax.models.common.bfl.names.BflNames`: ``to_module``, ``to_original``, ``fused``,
``tensor_key`` …).
"""

from __future__ import annotations

from ditax.models.common.bfl.names import (FUSED_DOUBLE, ONE_TO_ONE, QKV, BflNames,
                                           DOUBLE as _D, SINGLE as _S, TDOUBLE as _TD,
                                           TSINGLE as _TS, embedder_names, mlp_names)

#: fused original layer → pieces (diffusers module, start, stop) in units of the input width
FUSED: dict[str, tuple[tuple[str, int, int], ...]] = {
    **FUSED_DOUBLE,
    f"{_S}.linear1": tuple((f"{_TS}.{m}", 0, 1) for m in QKV) + ((f"{_TS}.proj_mlp", 0, 4),),
    # XLabs' single-block LoRA: q, k, v only (no MLP rows)
    f"{_S}.processor.qkv_lora": tuple((f"{_TS}.{m}", 0, 1) for m in QKV),
}

# (original, diffusers) one-to-one; BFL's names first (they win on export), then XLabs' aliases
_ONE_TO_ONE = ONE_TO_ONE + embedder_names("time_text_embed", (
    ("time_in", "timestep_embedder"), ("vector_in", "text_embedder"),
    ("guidance_in", "guidance_embedder"))) + mlp_names("net.0.proj", "net.2") + (
    (f"{_D}.img_mod.lin", f"{_TD}.norm1.linear"),
    (f"{_D}.txt_mod.lin", f"{_TD}.norm1_context.linear"),
    (f"{_S}.modulation.lin", f"{_TS}.norm.linear"),
    (f"{_S}.linear2", f"{_TS}.proj_out"),
    (f"{_D}.processor.proj_lora1", f"{_TD}.attn.to_out.0"),
    (f"{_D}.processor.proj_lora2", f"{_TD}.attn.to_add_out"),
    (f"{_S}.processor.proj_lora", f"{_TS}.proj_out"),
)
# XLabs' double-block qkv LoRAs are BFL's fused layers under other names
_ALIASES = ((f"{_D}.processor.qkv_lora1", f"{_D}.img_attn.qkv"),
            (f"{_D}.processor.qkv_lora2", f"{_D}.txt_attn.qkv"))

NAMES = BflNames(_ONE_TO_ONE, FUSED, _ALIASES, "FLUX.1")


__all__ = ["FUSED", "NAMES"]
