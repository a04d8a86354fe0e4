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

:data:`PAIRS` lists the one-to-one names, :data:`FUSED` the fused layers as *pieces*
``(diffusers module, start, stop)`` in the fused tensor's row order, ``start:stop`` in units of
the layer's input width D (every fused layer reads the D-wide stream), so the same pieces
split a base weight, a LoRA's ``lora_up``, a bias delta, and assemble an exported LoRA. BFL's
RMSNorm gains are ``.scale`` where diffusers has ``.weight``.
"""

from __future__ import annotations

from ditax.models.common.name_map import NameMap, split_suffix

_D, _S = "double_blocks.{i}", "single_blocks.{i}"
_TD, _TS = "transformer_blocks.{i}", "single_transformer_blocks.{i}"

_QKV = ("attn.to_q", "attn.to_k", "attn.to_v")
_ADD_QKV = ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")

#: fused original layer → pieces (diffusers module, start, stop) in units of the input width
FUSED: dict[str, tuple[tuple[str, int, int], ...]] = {
    f"{_D}.img_attn.qkv": tuple((f"{_TD}.{m}", 0, 1) for m in _QKV),
    f"{_D}.txt_attn.qkv": tuple((f"{_TD}.{m}", 0, 1) for m in _ADD_QKV),
    f"{_S}.linear1": tuple((f"{_TS}.{m}", 0, 1) for m in _QKV) + ((f"{_TS}.proj_mlp", 0, 4),),
    "final_layer.adaLN_modulation.1": (("norm_out.linear", 1, 2), ("norm_out.linear", 0, 1)),
    # XLabs' single-block LoRA: q, k, v only (no MLP rows)
    f"{_S}.processor.qkv_lora": tuple((f"{_TS}.{m}", 0, 1) for m in _QKV),
}

# (original, diffusers) one-to-one; BFL's names first (they win on export), then XLabs' aliases
_ONE_TO_ONE = (
    ("img_in", "x_embedder"),
    ("txt_in", "context_embedder"),
    ("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"),
    ("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"),
    ("vector_in.in_layer", "time_text_embed.text_embedder.linear_1"),
    ("vector_in.out_layer", "time_text_embed.text_embedder.linear_2"),
    ("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"),
    ("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"),
    (f"{_D}.img_mod.lin", f"{_TD}.norm1.linear"),
    (f"{_D}.txt_mod.lin", f"{_TD}.norm1_context.linear"),
    (f"{_D}.img_attn.norm.query_norm", f"{_TD}.attn.norm_q"),
    (f"{_D}.img_attn.norm.key_norm", f"{_TD}.attn.norm_k"),
    (f"{_D}.txt_attn.norm.query_norm", f"{_TD}.attn.norm_added_q"),
    (f"{_D}.txt_attn.norm.key_norm", f"{_TD}.attn.norm_added_k"),
    (f"{_D}.img_attn.proj", f"{_TD}.attn.to_out.0"),
    (f"{_D}.txt_attn.proj", f"{_TD}.attn.to_add_out"),
    (f"{_D}.img_mlp.0", f"{_TD}.ff.net.0.proj"),
    (f"{_D}.img_mlp.2", f"{_TD}.ff.net.2"),
    (f"{_D}.txt_mlp.0", f"{_TD}.ff_context.net.0.proj"),
    (f"{_D}.txt_mlp.2", f"{_TD}.ff_context.net.2"),
    (f"{_S}.modulation.lin", f"{_TS}.norm.linear"),
    (f"{_S}.norm.query_norm", f"{_TS}.attn.norm_q"),
    (f"{_S}.norm.key_norm", f"{_TS}.attn.norm_k"),
    (f"{_S}.linear2", f"{_TS}.proj_out"),
    ("final_layer.linear", "proj_out"),
    (f"{_D}.processor.proj_lora1", f"{_TD}.attn.to_out.0"),
    (f"{_D}.processor.proj_lora2", f"{_TD}.attn.to_add_out"),
    (f"{_S}.processor.proj_lora", f"{_TS}.proj_out"),
)
# XLabs' double-block qkv LoRAs are BFL's fused layers under other names
_ALIASES = ((f"{_D}.processor.qkv_lora1", f"{_D}.img_attn.qkv"),
            (f"{_D}.processor.qkv_lora2", f"{_D}.txt_attn.qkv"))

#: module names only (diffusers side), for ``is_module`` and export
MODULES = NameMap(_ONE_TO_ONE)
#: every original name → a diffusers module name, or a fused layer's canonical original name
PAIRS = NameMap(_ONE_TO_ONE + _ALIASES + tuple((f, f) for f in FUSED))
_FUSED_NAMES = NameMap(tuple((f, f) for f in FUSED))
_MEMBER_OF = {m: f for f, pieces in FUSED.items() if "processor" not in f for m, _, _ in pieces}
_MEMBERS = NameMap(tuple((f, m) for m, f in _MEMBER_OF.items()))
# every diffusers module name (one-to-one and fused members) → itself, for the "_" spelling
_DIFFUSERS = NameMap(tuple((d, d) for _, d in _ONE_TO_ONE) + tuple((m, m) for m in _MEMBER_OF))


def to_module(name: str, sep: str = ".") -> str | None:
    """An original module name (``sep="_"``: kohya) → the diffusers module, or for a fused
    layer its canonical original name (split by :func:`fused`); None: not a Flux name."""
    return PAIRS.to_diffusers(name, sep)


def from_underscored(name: str) -> str | None:
    """A diffusers module name spelt with ``_`` for ``.`` (diffusers-kohya
    ``lora_transformer_`` keys: ``transformer_blocks_0_attn_to_q``) → the module name; None:
    no Flux module."""
    return _DIFFUSERS.to_diffusers(name, "_")


def to_original(module: str) -> str | None:
    """A diffusers module name → its original name (for a fused layer's member: the fused
    layer, e.g. ``transformer_blocks.0.attn.to_k`` → ``double_blocks.0.img_attn.qkv``)."""
    return MODULES.to_original(module) or _MEMBERS.to_original(module)


def fused(name: str) -> tuple[tuple[str, int, int], ...] | None:
    """The pieces of a fused original layer (concrete names: ``{i}`` filled), None for any
    other name."""
    if _FUSED_NAMES.to_diffusers(name) is None:
        return None
    parts = name.split(".")
    i = parts[1] if len(parts) > 1 and parts[1].isdigit() else None
    template = ".".join(parts[:1] + ["{i}"] + parts[2:]) if i is not None else name
    return tuple((m.format(i=i) if i is not None else m, a, b) for m, a, b in FUSED[template])


def is_module(name: str) -> bool:
    """Whether ``name`` is a diffusers module (or parameter) name of the Flux transformer."""
    return (MODULES.diffusers_pattern().fullmatch(name) is not None
            or _MEMBERS.diffusers_pattern().fullmatch(name) is not None)


def tensor_key(module_key: str) -> tuple[str, str]:
    """A diffusers tensor key → (original module name, original suffix) (RMSNorm ``.weight`` is
    BFL's ``.scale``); the module may be a fused layer's member (see :func:`to_original`)."""
    name, suffix = split_suffix(module_key)
    orig = to_original(name)
    if orig is None:
        raise KeyError(f"no original FLUX.1 name for {module_key}")
    if orig.endswith(("query_norm", "key_norm")) and suffix == ".weight":
        suffix = ".scale"
    return orig, suffix


__all__ = ["FUSED", "PAIRS", "from_underscored", "fused", "is_module", "tensor_key", "to_module", "to_original"]
