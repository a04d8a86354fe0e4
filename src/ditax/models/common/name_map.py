"""Two naming schemes of one model's modules as one table of template pairs (a floor).

A family's original checkpoints (Wan / ComfyUI, BFL's FLUX.1) name modules differently from
diffusers. :class:`NameMap` holds ``(original template, diffusers template)`` pairs, ``{i}``
marking a block index, and converts a concrete name either way; ``sep="_"`` reads the
kohya / musubi-tuner spelling of original names (``blocks_3_self_attn_q``), where every ``.``
is a ``_``. Full tensor keys are a name plus an optional suffix (:func:`split_suffix`).
"""

from __future__ import annotations

import functools
import re

SUFFIXES = (".weight", ".bias")
#: the key prefixes of original-name checkpoints and LoRAs (ComfyUI's and the trainers'):
#: stripped before the names are read
ORIGINAL_PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def split_suffix(key: str, suffixes=SUFFIXES) -> tuple[str, str]:
    """``"blocks.0.ffn.0.weight"`` → ``("blocks.0.ffn.0", ".weight")``; no suffix → ``""``."""
    for s in suffixes:
        if key.endswith(s):
            return key[:-len(s)], s
    return key, ""


def _pattern(template: str, sep: str) -> str:
    parts = [re.escape(p.replace(".", sep)) for p in template.split("{i}")]
    return r"(?P<i>\d+)".join(parts)


class NameMap:
    """``pairs``: ``(original, diffusers)`` name templates; the first pair that matches wins."""

    def __init__(self, pairs):
        self.pairs = tuple(pairs)

    @functools.lru_cache(maxsize=None)
    def _matchers(self, side: int, sep: str):
        return [(re.compile(_pattern(p[side], sep)), p[1 - side]) for p in self.pairs]

    def _convert(self, name: str, side: int, sep: str = ".") -> str | None:
        for rx, other in self._matchers(side, sep):
            m = rx.fullmatch(name)
            if m:
                return other.format(i=m.group("i")) if "i" in rx.groupindex else other
        return None

    def to_diffusers(self, name: str, sep: str = ".") -> str | None:
        """Original name (``sep="_"``: kohya spelling) → the diffusers one (None: unknown)."""
        return self._convert(name, 0, sep)

    def to_original(self, name: str) -> str | None:
        """Diffusers name (or a ``{i}`` template) → the original one (None: unknown)."""
        if "{i}" in name:
            return next((o for o, d in self.pairs if d == name), None)
        return self._convert(name, 1)

    @functools.lru_cache(maxsize=None)
    def diffusers_pattern(self) -> re.Pattern:
        """One regex that fully matches every concrete diffusers name of the table."""
        alts = [re.escape(d).replace(r"\{i\}", r"\d+") for _, d in self.pairs]
        return re.compile("|".join(f"(?:{a})" for a in alts))


def original_lora_names(to_module, to_original, is_module, *, export_prefix="diffusion_model.",
                        **names):
    """A family's :class:`~ditax.lora.names.LoraNames` for LoRAs in its original names as
    well as diffusers' (``to_module(name, sep=".")`` / ``to_original(module)`` /
    ``is_module(name)``: the family's name table), the original keys read under
    :data:`ORIGINAL_PREFIXES` and exported under ``export_prefix``; ``names``: the other
    fields (family, model, targets, messages, fused layers …)."""
    from ditax.lora.names import LoraNames

    return LoraNames(to_module=to_module, to_original=to_original, is_module=is_module,
                     original_prefixes=ORIGINAL_PREFIXES, export_prefix=export_prefix, **names)


__all__ = ["NameMap", "ORIGINAL_PREFIXES", "SUFFIXES", "original_lora_names", "split_suffix"]
