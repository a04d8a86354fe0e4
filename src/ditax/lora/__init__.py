"""LoRA machinery for any model family: every common file format → one table → merged into the
weights. The family supplies its names (:class:`~ditax.lora.names.LoraNames`; Wan's:
:mod:`ditax.models.wan.lora_names`); nothing here imports a family.

- :mod:`.names`: what a family tells the machinery (name maps, key prefixes, target groups);
- :mod:`.formats`: original (Wan / ComfyUI), musubi-tuner / kohya and diffusers / PEFT keys,
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
from ditax.lora.names import LoraNames
from ditax.lora.table import Lora, LoraRow, parse_lora, read_lora

# one LoRA as the user passes it: a path, a parsed Lora, or either with its strength
LoraSpec = Union[str, os.PathLike, Lora, tuple]


# the largest |strength| a LoRA is applied with (typical: 0.5-1.5; 10 is far past any use)
MAX_STRENGTH = 10.0


def resolve_loras(specs: Iterable[LoraSpec] | None, strict: bool = True, *,
                  names: LoraNames | None = None) -> list[tuple[Lora, float]]:
    """``[path | Lora | (path | Lora, strength)]`` → ``[(Lora, strength)]`` (strength 1.0 when
    not given); files are read and parsed here (:func:`read_lora`) with ``names``, the
    family's (needed only when a spec is a file)."""
    out = []
    for spec in specs or ():
        item, strength = spec if isinstance(spec, tuple) else (spec, 1.0)
        try:
            strength = float(strength)
        except (TypeError, ValueError):
            raise WeightError(f"LoRA {item!s}: strength {strength!r} is not a number") from None
        if strength != strength or strength in (float("inf"), float("-inf")):
            raise WeightError(f"LoRA {item!s}: strength {strength} is not a finite number")
        if abs(strength) > MAX_STRENGTH:
            raise WeightError(f"LoRA {item!s}: strength {strength:g} is beyond "
                              f"±{MAX_STRENGTH:g} (it would overflow the weights); use e.g. 0.8")
        if not isinstance(item, Lora):
            if names is None:
                raise TypeError(f"LoRA {item!s}: a file is parsed with its model family's "
                                f"names; pass names= (e.g. the family's lora_names)")
            item = read_lora(item, strict, names=names)
        out.append((item, strength))
    return out


def merged_weights(weights, loras: Iterable[LoraSpec] | None, table, shapes: dict, *,
                   names: LoraNames, strict: bool = True, rename=None,
                   context: str | None = None):
    """``weights`` with ``loras`` folded in as they are read (:class:`PatchedWeights`), after
    checking that every LoRA fits ``table`` (diffusers keys) with our parameter ``shapes``;
    ``names``: the family's (:class:`LoraNames`).

    ``rename``: diffusers key → the key ``weights`` holds (for checkpoints with other names).
    """
    resolved = resolve_loras(loras, strict, names=names)
    if not resolved:
        return weights
    patches = plan_patches(resolved, upstream_shapes(table, shapes),
                           context or f"the {table.name} ({table.context})", names=names)
    if rename is not None:
        patches = {rename(k): v for k, v in patches.items()}
    return PatchedWeights(weights, patches)


#: what a LoRA file's name ends in: text after ``FILE.safetensors:`` must be a strength
_LORA_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin")


def parse_lora_arg(text: str) -> tuple[str, float]:
    """``FILE[:STRENGTH]`` (the CLI's ``--lora``) → ``(file, strength)``; strength 1.0 when
    none is given. The text after the last ``:`` is part of the path when it holds a ``/``
    (``c:/x.safetensors``) or the text before it is no weights file name; otherwise it must be
    a finite number, else :class:`~ditax.errors.RequestError` (``x.safetensors:abc``,
    ``x.safetensors:nan``, ``x.safetensors:``)."""
    import math
    import pathlib

    from ditax.errors import RequestError

    example = "style.safetensors:0.8 (or FILE alone for 1.0)"
    if not text.strip():
        raise RequestError(f"--lora {text!r} names no file; write FILE:STRENGTH, e.g. {example}")
    path, sep, tail = text.rpartition(":")
    if not sep or "/" in tail or "\\" in tail:
        return text, 1.0
    try:
        strength = float(tail)
    except ValueError:
        if not (path.lower().endswith(_LORA_SUFFIXES) or pathlib.Path(path).is_file()):
            return text, 1.0           # a ':' inside the file name
        raise RequestError(f"--lora {text!r}: strength {tail!r} is not a number; write "
                           f"FILE:STRENGTH, e.g. {path}:0.8 (or FILE alone for 1.0)") from None
    if not path.strip():
        raise RequestError(f"--lora {text!r} names no file before the strength; write "
                           f"FILE:STRENGTH, e.g. {example}")
    if not math.isfinite(strength):
        raise RequestError(f"--lora {text!r}: strength {tail} is not a finite number; use e.g. "
                           f"{path}:0.8")
    if abs(strength) > MAX_STRENGTH:
        raise RequestError(f"--lora {text!r}: strength {tail} is beyond ±{MAX_STRENGTH:g} (a "
                           f"LoRA at such a strength overflows the weights); use e.g. "
                           f"{path}:0.8")
    return path, strength


__all__ = ["MAX_STRENGTH", "Lora", "LoraNames", "LoraRow", "LoraSpec", "Patch", "PatchedWeights", "merged_weights",
           "parse_lora", "parse_lora_arg", "plan_patches", "read_lora", "resolve_loras",
           "upstream_shapes"]
