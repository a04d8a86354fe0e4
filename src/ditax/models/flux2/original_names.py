"""BFL's original FLUX.2 names ↔ diffusers ``Flux2Transformer2DModel`` names: one table.

BFL's checkpoints and the LoRA trainers that follow them (ai-toolkit / ComfyUI
``diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight``, kohya
``lora_unet_double_blocks_0_img_attn_qkv``) name the modules as diffusers' converter
``_convert_non_diffusers_flux2_lora_to_diffusers`` maps them. Two BFL layers are several
diffusers layers in one:

- ``double_blocks.N.img_attn.qkv`` = ``attn.to_q``, ``to_k``, ``to_v`` stacked along the output
  (``txt_attn.qkv``: ``add_q_proj``, ``add_k_proj``, ``add_v_proj``);
- ``final_layer.adaLN_modulation.1`` = ``norm_out.linear`` with its two halves swapped (BFL
  computes ``shift, scale``, diffusers ``scale, shift``).

The single blocks' fused projections are fused in diffusers too (``linear1`` =
``attn.to_qkv_mlp_proj``, ``linear2`` = ``attn.to_out``), so they map one to one. Pieces are
``(diffusers module, start, stop)`` in units of the layer's input width D, as FLUX.1's
(:mod:`ditax.models.flux.original_names`). The same table reads BFL's single-file checkpoints
(:mod:`.single_file`; :data:`NAMES`'s ``tensor_key``: BFL's RMSNorm gains are ``.scale``
where diffusers has ``.weight``).
"""

from __future__ import annotations

from ditax.models.common.bfl.names import (FUSED_DOUBLE, ONE_TO_ONE, BflNames,
                                           SINGLE as _S, TSINGLE as _TS, embedder_names,
                                           mlp_names)

#: fused original layer → pieces (diffusers module, start, stop) in units of the input width
FUSED: dict[str, tuple[tuple[str, int, int], ...]] = dict(FUSED_DOUBLE)

# (original, diffusers) one-to-one
_ONE_TO_ONE = ONE_TO_ONE + embedder_names("time_guidance_embed", (
    ("time_in", "timestep_embedder"), ("guidance_in", "guidance_embedder"))) + mlp_names(
    "linear_in", "linear_out") + tuple((f"{m}.lin", f"{m}.linear") for m in (
        "double_stream_modulation_img", "double_stream_modulation_txt",
        "single_stream_modulation")) + (
    (f"{_S}.linear1", f"{_TS}.attn.to_qkv_mlp_proj"),
    (f"{_S}.linear2", f"{_TS}.attn.to_out"),
)

NAMES = BflNames(_ONE_TO_ONE, FUSED, (), "FLUX.2")


__all__ = ["FUSED", "NAMES"]
