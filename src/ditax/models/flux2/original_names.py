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
(:mod:`.single_file`; :func:`tensor_key`: BFL's RMSNorm gains are ``.scale`` where diffusers
has ``.weight``).
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
    "final_layer.adaLN_modulation.1": (("norm_out.linear", 1, 2), ("norm_out.linear", 0, 1)),
}

# (original, diffusers) one-to-one
_ONE_TO_ONE = (
    ("img_in", "x_embedder"),
    ("txt_in", "context_embedder"),
    ("time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1"),
    ("time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2"),
    ("guidance_in.in_layer", "time_guidance_embed.guidance_embedder.linear_1"),
    ("guidance_in.out_layer", "time_guidance_embed.guidance_embedder.linear_2"),
    ("double_stream_modulation_img.lin", "double_stream_modulation_img.linear"),
    ("double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear"),
    ("single_stream_modulation.lin", "single_stream_modulation.linear"),
    (f"{_D}.img_attn.norm.query_norm", f"{_TD}.attn.norm_q"),
    (f"{_D}.img_attn.norm.key_norm", f"{_TD}.attn.norm_k"),
    (f"{_D}.txt_attn.norm.query_norm", f"{_TD}.attn.norm_added_q"),
    (f"{_D}.txt_attn.norm.key_norm", f"{_TD}.attn.norm_added_k"),
    (f"{_D}.img_attn.proj", f"{_TD}.attn.to_out.0"),
    (f"{_D}.txt_attn.proj", f"{_TD}.attn.to_add_out"),
    (f"{_D}.img_mlp.0", f"{_TD}.ff.linear_in"),
    (f"{_D}.img_mlp.2", f"{_TD}.ff.linear_out"),
    (f"{_D}.txt_mlp.0", f"{_TD}.ff_context.linear_in"),
    (f"{_D}.txt_mlp.2", f"{_TD}.ff_context.linear_out"),
    (f"{_S}.norm.query_norm", f"{_TS}.attn.norm_q"),
    (f"{_S}.norm.key_norm", f"{_TS}.attn.norm_k"),
    (f"{_S}.linear1", f"{_TS}.attn.to_qkv_mlp_proj"),
    (f"{_S}.linear2", f"{_TS}.attn.to_out"),
    ("final_layer.linear", "proj_out"),
)

#: module names only (diffusers side), for ``is_module`` and export
MODULES = NameMap(_ONE_TO_ONE)
#: every original name → a diffusers module name, or a fused layer's canonical original name
PAIRS = NameMap(_ONE_TO_ONE + tuple((f, f) for f in FUSED))
_FUSED_NAMES = NameMap(tuple((f, f) for f in FUSED))
_MEMBER_OF = {m: f for f, pieces in FUSED.items() for m, _, _ in pieces}
_MEMBERS = NameMap(tuple((f, m) for m, f in _MEMBER_OF.items()))
# every diffusers module name (one-to-one and fused members) → itself, for the "_" spelling
_DIFFUSERS = NameMap(tuple((d, d) for _, d in _ONE_TO_ONE) + tuple((m, m) for m in _MEMBER_OF))


def to_module(name: str, sep: str = ".") -> str | None:
    """An original module name (``sep="_"``: kohya) → the diffusers module, or for a fused
    layer its canonical original name (split by :func:`fused`); None: not a FLUX.2 name."""
    return PAIRS.to_diffusers(name, sep)


def from_underscored(name: str) -> str | None:
    """A diffusers module name spelt with ``_`` for ``.`` (``transformer_blocks_0_attn_to_q``)
    → the module name; None: no FLUX.2 module."""
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
    """Whether ``name`` is a diffusers module (or parameter) name of the FLUX.2 transformer."""
    return (MODULES.diffusers_pattern().fullmatch(name) is not None
            or _MEMBERS.diffusers_pattern().fullmatch(name) is not None)


def tensor_key(module_key: str) -> tuple[str, str]:
    """A diffusers tensor key → (BFL module name, BFL suffix): the module may be a fused
    layer's member (:func:`to_original`: ``transformer_blocks.0.attn.to_k.weight`` →
    ``double_blocks.0.img_attn.qkv``), an RMSNorm gain's ``.weight`` is BFL's ``.scale``."""
    name, suffix = split_suffix(module_key)
    orig = to_original(name)
    if orig is None:
        raise KeyError(f"no original FLUX.2 name for {module_key}")
    if orig.endswith(("query_norm", "key_norm")) and suffix == ".weight":
        suffix = ".scale"
    return orig, suffix


__all__ = ["FUSED", "PAIRS", "from_underscored", "fused", "is_module", "tensor_key",
           "to_module", "to_original"]
