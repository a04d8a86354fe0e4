"""The LoRA key formats, recognised from the keys alone, for a family's names.

Each format turns one tensor key into ``(module name, part)`` or None, where ``part`` is one
of :data:`PARTS`; the family's :class:`~ditax.lora.names.LoraNames` (``names``) says which
names exist and how original names map to module names (Wan in the examples):

- ``original`` — the original / ComfyUI names (``diffusion_model.blocks.3.self_attn.q``),
  with one of ``names.original_prefixes`` or none; ``lora_down``/``lora_up``,
  ``lora_A``/``lora_B`` or (XLabs) ``down``/``up`` ``.weight``, ``alpha``, ``diff_b`` (bias
  delta), ``diff`` (full delta);
- ``musubi`` — musubi-tuner / kohya: ``lora_unet_`` + the original name with ``_`` for ``.``
  (``lora_unet_blocks_3_self_attn_q``), ``lora_down``/``lora_up`` ``.weight`` and ``alpha``;
- ``kohya_diffusers`` — kohya keys over the diffusers module names (diffusers' "mixture"
  files): ``lora_transformer_`` + the module name with ``_`` for ``.``
  (``lora_transformer_single_transformer_blocks_0_attn_to_q``), ``lora_down``/``lora_up``
  ``.weight`` and ``alpha``; only for a family whose names read such names back
  (``names.underscored``);
- ``peft`` — diffusers / PEFT: ``transformer.`` (or ``base_model.model.``) + the module name
  (``transformer.blocks.3.attn1.to_q``), ``lora_A.weight``, ``lora_B.weight``,
  ``lora_B.bias``.

:func:`detect` picks the format that explains the most keys.
"""

from __future__ import annotations

from ditax.lora.names import LoraNames

# normalised parts: down [r, in], up [out, r], alpha (scalar), bias delta [out], full delta
PARTS = ("down", "up", "alpha", "bias", "diff")

_ORIGINAL_PARTS = {"lora_down.weight": "down", "lora_A.weight": "down", "lora_up.weight": "up",
                   "lora_B.weight": "up", "alpha": "alpha", "diff_b": "bias", "diff": "diff",
                   "down.weight": "down", "up.weight": "up"}    # the last two: XLabs
_MUSUBI_PARTS = {"lora_down.weight": "down", "lora_up.weight": "up", "alpha": "alpha",
                 "diff_b": "bias", "diff": "diff"}
_PEFT_PARTS = {"lora_A.weight": "down", "lora_B.weight": "up", "lora_B.bias": "bias"}


def _split(key: str, parts: dict[str, str]) -> tuple[str, str] | None:
    for suffix, part in parts.items():
        if key.endswith("." + suffix):
            return key[:-len(suffix) - 1], part
    return None


def _strip(key: str, prefixes: tuple[str, ...]) -> str:
    for p in prefixes:
        if key.startswith(p):
            return key[len(p):]
    return key


def original(key: str, names: LoraNames):
    """``diffusion_model.blocks.3.self_attn.q.lora_down.weight`` → (``blocks.3.attn1.to_q``,
    ``down``)."""
    split = _split(_strip(key, names.original_prefixes), _ORIGINAL_PARTS)
    if split is None:
        return None
    name = names.to_module(split[0])
    return None if name is None else (name, split[1])


def musubi(key: str, names: LoraNames):
    """``lora_unet_blocks_3_self_attn_q.lora_down.weight`` → (``blocks.3.attn1.to_q``,
    ``down``)."""
    if not key.startswith("lora_unet_"):
        return None
    split = _split(key[len("lora_unet_"):], _MUSUBI_PARTS)
    if split is None:
        return None
    name = names.to_module(split[0], sep="_")
    return None if name is None else (name, split[1])


def kohya_diffusers(key: str, names: LoraNames):
    """``lora_transformer_transformer_blocks_0_attn_to_q.lora_down.weight`` →
    (``transformer_blocks.0.attn.to_q``, ``down``)."""
    if names.underscored is None or not key.startswith("lora_transformer_"):
        return None
    split = _split(key[len("lora_transformer_"):], _MUSUBI_PARTS)
    if split is None:
        return None
    name = names.underscored(split[0])
    return None if name is None else (name, split[1])


#: kohya / sd-scripts text-encoder keys (CLIP-L ``lora_te1_``, a second tower ``lora_te2_``)
#: and diffusers' ``text_encoder.`` ones: LoRA rows for a text tower, not the transformer
TEXT_ENCODER_PREFIXES = ("lora_te_", "lora_te1_", "lora_te2_", "text_encoder.",
                         "text_encoder_2.")


def text_encoder_keys(keys) -> list[str]:
    """The keys of ``keys`` that update a text encoder (:data:`TEXT_ENCODER_PREFIXES`)."""
    return [k for k in keys if k.startswith(TEXT_ENCODER_PREFIXES)]


def peft(key: str, names: LoraNames):
    """``transformer.blocks.3.attn1.to_q.lora_A.weight`` → (``blocks.3.attn1.to_q``, ``down``)."""
    split = _split(_strip(key, ("transformer.", "base_model.model.")), _PEFT_PARTS)
    if split is None or not names.is_module(split[0]):
        return None
    return split


FORMATS = {"original": original, "musubi": musubi, "kohya_diffusers": kohya_diffusers,
           "peft": peft}


def detect(keys, names: LoraNames) -> str | None:
    """The format that recognises the most of ``keys`` (None: none recognises any)."""
    keys = list(keys)
    counts = {name: sum(fn(k, names) is not None for k in keys) for name, fn in FORMATS.items()}
    best = max(counts, key=counts.get)
    return best if counts[best] else None
