"""BFL's original names ↔ diffusers names of a FLUX.1 / FLUX.2 transformer, from the family's
table (:class:`BflNames`; the tables: :mod:`ditax.models.flux.original_names`,
:mod:`ditax.models.flux2.original_names`).

A table lists the one-to-one names ``(original, diffusers)`` (``{i}`` = a block index; the
first pair that matches wins on export), the *fused* original layers as pieces ``(diffusers
module, start, stop)`` in the fused tensor's row order (``start:stop`` in units of the
layer's input width D: every fused layer reads the D-wide stream), so the same pieces split a
base weight, a LoRA's ``lora_up``, a bias delta, and assemble an exported LoRA, and aliases
(other trainers' names of fused layers). A fused name with ``processor`` in it (XLabs'
LoRA-only layers) has no members of its own. BFL's RMSNorm gains are ``.scale`` where
diffusers has ``.weight``.
"""

from __future__ import annotations

from ditax.models.common.name_map import NameMap, original_lora_names, split_suffix

#: the module names of BFL's two block kinds and of diffusers'
DOUBLE, SINGLE = "double_blocks.{i}", "single_blocks.{i}"
TDOUBLE, TSINGLE = "transformer_blocks.{i}", "single_transformer_blocks.{i}"
QKV = ("attn.to_q", "attn.to_k", "attn.to_v")
ADD_QKV = ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")

#: the one-to-one names both families have (BFL's first: they win on export)
ONE_TO_ONE = (
    ("img_in", "x_embedder"),
    ("txt_in", "context_embedder"),
    (f"{DOUBLE}.img_attn.norm.query_norm", f"{TDOUBLE}.attn.norm_q"),
    (f"{DOUBLE}.img_attn.norm.key_norm", f"{TDOUBLE}.attn.norm_k"),
    (f"{DOUBLE}.txt_attn.norm.query_norm", f"{TDOUBLE}.attn.norm_added_q"),
    (f"{DOUBLE}.txt_attn.norm.key_norm", f"{TDOUBLE}.attn.norm_added_k"),
    (f"{DOUBLE}.img_attn.proj", f"{TDOUBLE}.attn.to_out.0"),
    (f"{DOUBLE}.txt_attn.proj", f"{TDOUBLE}.attn.to_add_out"),
    (f"{SINGLE}.norm.query_norm", f"{TSINGLE}.attn.norm_q"),
    (f"{SINGLE}.norm.key_norm", f"{TSINGLE}.attn.norm_k"),
    ("final_layer.linear", "proj_out"),
)


def embedder_names(module: str, embedders) -> tuple:
    """The ``(original, diffusers)`` names of the two linears of each time / text /
    guidance embedder: ``embedders`` ``(BFL name, diffusers name)`` under diffusers'
    ``module`` (``in_layer`` = ``linear_1``, ``out_layer`` = ``linear_2``)."""
    return tuple((f"{o}.{a}", f"{module}.{d}.{b}") for o, d in embedders
                 for a, b in (("in_layer", "linear_1"), ("out_layer", "linear_2")))


def mlp_names(first: str, second: str) -> tuple:
    """The ``(original, diffusers)`` names of the double blocks' two MLPs (``img_mlp.0`` /
    ``.2``, ``txt_mlp.0`` / ``.2``), diffusers' ``ff.<first>`` / ``ff.<second>``."""
    return tuple((f"{DOUBLE}.{o}_mlp.{i}", f"{TDOUBLE}.{d}.{n}")
                 for o, d in (("img", "ff"), ("txt", "ff_context"))
                 for i, n in ((0, first), (2, second)))


#: the fused layers both families have: the double blocks' q / k / v (image and text) and
#: the final modulation with its halves swapped (BFL: shift, scale; diffusers: scale, shift)
FUSED_DOUBLE = {
    f"{DOUBLE}.img_attn.qkv": tuple((f"{TDOUBLE}.{m}", 0, 1) for m in QKV),
    f"{DOUBLE}.txt_attn.qkv": tuple((f"{TDOUBLE}.{m}", 0, 1) for m in ADD_QKV),
    "final_layer.adaLN_modulation.1": (("norm_out.linear", 1, 2), ("norm_out.linear", 0, 1)),
}


class BflNames:
    """One family's name table (module docstring): ``one_to_one`` ``(original, diffusers)``
    pairs, ``fused`` original layer → pieces, ``aliases`` ``(other name, fused original
    name)``; ``model``: the family in messages ("FLUX.1")."""

    def __init__(self, one_to_one, fused: dict, aliases=(), model: str = "FLUX"):
        self.model = model
        self.fused_table = fused
        #: module names only (diffusers side), for ``is_module`` and export
        self.modules = NameMap(one_to_one)
        #: every original name → a diffusers module name, or a fused layer's canonical name
        self.pairs = NameMap(tuple(one_to_one) + tuple(aliases) + tuple((f, f) for f in fused))
        self._fused_names = NameMap(tuple((f, f) for f in fused))
        member_of = {m: f for f, pieces in fused.items() if "processor" not in f
                     for m, _, _ in pieces}
        self._members = NameMap(tuple((f, m) for m, f in member_of.items()))
        # every diffusers module name (one-to-one and fused members) → itself ("_" spelling)
        self._diffusers = NameMap(tuple((d, d) for _, d in one_to_one)
                                  + tuple((m, m) for m in member_of))

    def to_module(self, name: str, sep: str = ".") -> str | None:
        """An original module name (``sep="_"``: kohya) → the diffusers module, or for a fused
        layer its canonical original name (split by :meth:`fused`); None: not the family's."""
        return self.pairs.to_diffusers(name, sep)

    def from_underscored(self, name: str) -> str | None:
        """A diffusers module name spelt with ``_`` for ``.`` (diffusers-kohya
        ``lora_transformer_`` keys: ``transformer_blocks_0_attn_to_q``) → the module name;
        None: no module of the family."""
        return self._diffusers.to_diffusers(name, "_")

    def to_original(self, module: str) -> str | None:
        """A diffusers module name → its original name (for a fused layer's member: the fused
        layer, e.g. ``transformer_blocks.0.attn.to_k`` → ``double_blocks.0.img_attn.qkv``)."""
        return self.modules.to_original(module) or self._members.to_original(module)

    def fused(self, name: str) -> tuple[tuple[str, int, int], ...] | None:
        """The pieces of a fused original layer (concrete names: ``{i}`` filled), None for
        any other name."""
        if self._fused_names.to_diffusers(name) is None:
            return None
        parts = name.split(".")
        i = parts[1] if len(parts) > 1 and parts[1].isdigit() else None
        template = ".".join(parts[:1] + ["{i}"] + parts[2:]) if i is not None else name
        return tuple((m.format(i=i) if i is not None else m, a, b)
                     for m, a, b in self.fused_table[template])

    def is_module(self, name: str) -> bool:
        """Whether ``name`` is a diffusers module (or parameter) name of the transformer."""
        return (self.modules.diffusers_pattern().fullmatch(name) is not None
                or self._members.diffusers_pattern().fullmatch(name) is not None)

    def tensor_key(self, module_key: str) -> tuple[str, str]:
        """A diffusers tensor key → (BFL module name, BFL suffix): the module may be a fused
        layer's member (:meth:`to_original`), an RMSNorm gain's ``.weight`` is BFL's
        ``.scale``."""
        name, suffix = split_suffix(module_key)
        orig = self.to_original(name)
        if orig is None:
            raise KeyError(f"no original {self.model} name for {module_key}")
        if orig.endswith(("query_norm", "key_norm")) and suffix == ".weight":
            suffix = ".scale"
        return orig, suffix

    def lora_names(self, family: str, targets: dict, mismatch_hint: str, formats: str):
        """The family's :class:`~ditax.lora.names.LoraNames` over this table: diffusers /
        PEFT keys, BFL / ComfyUI keys (``diffusion_model.`` first), kohya's (``lora_unet_`` +
        BFL names with ``_``: what export writes, the fused layers assembled again) and
        diffusers-kohya's; ``family`` (its name in messages), ``targets`` (the target groups'
        patterns), ``mismatch_hint`` and ``formats`` (the other formats, with examples) are
        the family's own."""
        return original_lora_names(
            self.to_module, self.to_original, self.is_module, export_prefix="lora_unet_",
            export_sep="_", fused=self.fused, underscored=self.from_underscored,
            layer_key=r"^(?:single_)?transformer_blocks\.(\d+)\.", family=family,
            model=f"the {self.model} transformer", targets=targets,
            description=("diffusers / PEFT (transformer.transformer_blocks.N.attn.to_q.lora_A."
                         "weight), " + formats),
            mismatch_hint=mismatch_hint)


__all__ = ["ADD_QKV", "BflNames", "DOUBLE", "FUSED_DOUBLE", "ONE_TO_ONE", "QKV", "SINGLE",
           "TDOUBLE", "TSINGLE", "embedder_names", "mlp_names"]
