"""LoRA for the Wan transformer: every common file format → one table → merged into the weights.

- :mod:`.formats`: original Wan / ComfyUI, musubi-tuner / kohya and diffusers / PEFT keys,
  detected from the keys;
- :mod:`.table`: :func:`read_lora` → :class:`Lora` (rows keyed by diffusers module names);
- :mod:`.merge`: the fit checks and the slice-by-slice merge applied while loading;
- :mod:`.unmerged`: the same updates kept as run-time low-rank terms (strengths are data).

``ditax.load_transformer(path, loras=[("style.safetensors", 0.8)])`` and
``ditax.load_pipeline(path, loras=[...], loras_2=[...])`` use :func:`merged_weights`, or
:func:`ditax.lora.unmerged.attach` with ``lora_mode="unmerged"``.
"""

from __future__ import annotations

import os
from typing import Iterable, Union

from ditax.errors import WeightError
from ditax.lora.merge import Patch, PatchedWeights, plan_patches, upstream_shapes
from ditax.lora.table import Lora, LoraRow, parse_lora, read_lora

# one LoRA as the user passes it: a path, a parsed Lora, or either with its strength
LoraSpec = Union[str, os.PathLike, Lora, tuple]


def resolve_loras(specs: Iterable[LoraSpec] | None,
                  strict: bool = True) -> list[tuple[Lora, float]]:
    """``[path | Lora | (path | Lora, strength)]`` → ``[(Lora, strength)]`` (strength 1.0 when
    not given); files are read and parsed here (:func:`read_lora`)."""
    out = []
    for spec in specs or ():
        item, strength = spec if isinstance(spec, tuple) else (spec, 1.0)
        try:
            strength = float(strength)
        except (TypeError, ValueError):
            raise WeightError(f"LoRA {item!s}: strength {strength!r} is not a number") from None
        out.append((item if isinstance(item, Lora) else read_lora(item, strict), strength))
    return out


def merged_weights(weights, loras: Iterable[LoraSpec] | None, table, shapes: dict, *,
                   strict: bool = True, rename=None, context: str | None = None):
    """``weights`` with ``loras`` folded in as they are read (:class:`PatchedWeights`), after
    checking that every LoRA fits ``table`` (diffusers keys) with our parameter ``shapes``.

    ``rename``: diffusers key → the key ``weights`` holds (for checkpoints with other names).
    """
    resolved = resolve_loras(loras, strict)
    if not resolved:
        return weights
    patches = plan_patches(resolved, upstream_shapes(table, shapes),
                           context or f"the {table.name} ({table.context})")
    if rename is not None:
        patches = {rename(k): v for k, v in patches.items()}
    return PatchedWeights(weights, patches)


def parse_lora_arg(text: str) -> tuple[str, float]:
    """``FILE[:STRENGTH]`` (the CLI's ``--lora``) → ``(file, strength)``; strength 1.0 when the
    text after the last ``:`` is not a number."""
    path, sep, tail = text.rpartition(":")
    if sep:
        try:
            return path, float(tail)
        except ValueError:
            pass
    return text, 1.0


__all__ = ["Lora", "LoraRow", "LoraSpec", "Patch", "PatchedWeights", "merged_weights",
           "parse_lora", "parse_lora_arg", "plan_patches", "read_lora", "resolve_loras",
           "upstream_shapes"]
