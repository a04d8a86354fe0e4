"""What the LoRA machinery needs to know of a model family's names: one :class:`LoraNames`.

``lora/`` reads, checks, merges, attaches and exports LoRAs for any family; it never imports a
family. The family supplies this object (Wan: :data:`ditax.models.wan.lora_names.LORA_NAMES`),
as diffusers keeps one LoRA key converter per family:

- the two directions of its name map, between the *module names* LoRA rows are keyed by (the
  upstream / diffusers names of the family's weight table, ``blocks.3.attn1.to_q``) and the
  *original* names other trainers write (Wan / ComfyUI ``blocks.3.self_attn.q``);
- which module names exist (a diffusers / PEFT key is recognised only for a real module);
- the key prefixes of original-name files, and the one written on export;
- how a module name spelt with ``_`` for ``.`` reads back (kohya files in diffusers names);
- its fused layers, if any: one original layer that is several modules stacked along the
  output (Flux's ``img_attn.qkv``); LoRA rows on them are split on reading and assembled on
  export;
- the LoRA *target groups* of fine-tuning (``lora.targets``): group name → regular
  expressions over our module paths (``blocks.attn1.to_q``: the dotted attribute path of a
  Linear layer in the module tree), levanter-style;
- the words its messages use.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class LoraNames:
    """A family's LoRA names (module docstring). Callables are plain functions of names."""

    family: str                                   # "Wan": "not a Wan LoRA"
    model: str                                    # "the Wan transformer": "match no layer of …"
    to_module: Callable[..., "str | None"]        # (original name, sep=".") → module name
    to_original: Callable[[str], "str | None"]    # module name → original name
    is_module: Callable[[str], bool]              # whether a module name is the model's
    original_prefixes: tuple[str, ...] = ()       # stripped from original-name keys
    export_prefix: str = ""                       # written before original names on export
    export_sep: str = "."                         # "_": kohya spelling of exported names
    # a fused original layer's name → its pieces ((module, start, stop), ...) in the stored
    # rows' order, start:stop in units of the rows per unit (Flux: q, k, v in one); None: none
    fused: "Callable[[str], tuple | None] | None" = None
    # a module name spelt with "_" for "." (diffusers-kohya ``lora_transformer_`` keys) → the
    # module name; None: the family has no such files
    underscored: "Callable[[str], str | None] | None" = None
    targets: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    description: str = ""                         # the formats, with examples (messages)
    mismatch_hint: str = "is it a LoRA for another model?"
    layer_key: str = r"^blocks\.(\d+)\."          # a block's module names (layer-count check)
    # key prefix → another component of the family's pipelines that the file's keys under it
    # update (LTX-2: "connectors." / "text_embedding_projection." → "connectors"); kept aside
    # in Lora.components for the pipeline loader, not rows of this model
    components: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def target_patterns(self, targets) -> tuple[re.Pattern, ...]:
        """The compiled module-path patterns of the target groups ``targets`` (names of
        :attr:`targets`); :class:`~ditax.errors.ConfigError` for a group the family lacks."""
        from ditax.errors import ConfigError

        out = []
        for t in targets:
            if t not in self.targets:
                raise ConfigError(f"lora.targets: {t!r} is no LoRA target group of "
                                  f"{self.model}; use a comma list of "
                                  f"{', '.join(self.targets)}")
            out.extend(re.compile(p) for p in self.targets[t])
        return tuple(out)


__all__ = ["LoraNames"]
