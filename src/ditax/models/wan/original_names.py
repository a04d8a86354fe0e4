"""Original Wan / ComfyUI names ↔ diffusers names of the Wan transformer: one table.

The original Wan code (and ComfyUI, which prefixes ``diffusion_model.``) names the transformer's
modules differently from diffusers' ``WanTransformer3DModel``: ``blocks.N.self_attn.q`` is
``blocks.N.attn1.to_q``, ``ffn.0`` is ``ffn.net.0.proj``, the cross-attention norm ``norm3`` is
diffusers' ``norm2``, ``head.head`` is ``proj_out``, and the modulation parameters are called
``scale_shift_table``. :data:`NAMES` lists every module (or bare parameter) once; both LoRA
formats that use original names (ComfyUI ``diffusion_model.…``, musubi-tuner
``lora_unet_blocks_N_…``) and the single-file base checkpoints are read through it.

A full tensor key is a name of the table plus an optional ``.weight`` / ``.bias`` suffix.
"""

from __future__ import annotations

from ditax.models.common.name_map import NameMap, split_suffix

_ATTN = (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"),
         ("norm_q", "norm_q"), ("norm_k", "norm_k"))

# (original name, diffusers name); "{i}" is the block index
NAMES: tuple[tuple[str, str], ...] = (
    ("patch_embedding", "patch_embedding"),
    ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
    ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
    ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
    ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    ("time_projection.1", "condition_embedder.time_proj"),
    ("img_emb.proj.0", "condition_embedder.image_embedder.norm1"),
    ("img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"),
    ("img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"),
    ("img_emb.proj.4", "condition_embedder.image_embedder.norm2"),
    *[(f"blocks.{{i}}.{ours}.{a}", f"blocks.{{i}}.{theirs}.{b}")
      for ours, theirs in (("self_attn", "attn1"), ("cross_attn", "attn2")) for a, b in _ATTN],
    ("blocks.{i}.cross_attn.k_img", "blocks.{i}.attn2.add_k_proj"),
    ("blocks.{i}.cross_attn.v_img", "blocks.{i}.attn2.add_v_proj"),
    ("blocks.{i}.cross_attn.norm_k_img", "blocks.{i}.attn2.norm_added_k"),
    ("blocks.{i}.norm3", "blocks.{i}.norm2"),
    ("blocks.{i}.ffn.0", "blocks.{i}.ffn.net.0.proj"),
    ("blocks.{i}.ffn.2", "blocks.{i}.ffn.net.2"),
    ("blocks.{i}.modulation", "blocks.{i}.scale_shift_table"),
    ("head.head", "proj_out"),
    ("head.modulation", "scale_shift_table"),
)

NAME_MAP = NameMap(NAMES)


def to_diffusers(name: str, sep: str = ".") -> str | None:
    """Original module / parameter name → the diffusers one (None: not a Wan name).

    ``sep="_"`` reads musubi-tuner / kohya names (``blocks_3_self_attn_q``)."""
    return NAME_MAP.to_diffusers(name, sep)


def to_original(name: str) -> str | None:
    """Diffusers module / parameter name (a ``{i}`` template too) → the original one."""
    return NAME_MAP.to_original(name)


def key_to_original(key: str) -> str | None:
    """A diffusers tensor key (or ``{i}`` template) → the original tensor key."""
    name, suffix = split_suffix(key)
    orig = to_original(name)
    return None if orig is None else orig + suffix


def key_to_diffusers(key: str) -> str | None:
    """An original tensor key → the diffusers tensor key."""
    name, suffix = split_suffix(key)
    theirs = to_diffusers(name)
    return None if theirs is None else theirs + suffix
