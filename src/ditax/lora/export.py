"""Trained adapters → LoRA files that diffusers, ComfyUI and ditax load.

:func:`adapter_factors` reads the ``lora_down [(L,) r, in]`` / ``lora_up [(L,) r, out]`` of a
trained parameter tree and names them by the model's weight table (diffusers module names,
one per layer). Two files are written:

- diffusers / PEFT keys (``transformer.blocks.0.attn1.to_q.lora_A.weight``, ``lora_B``), the
  scale ``alpha / r`` folded into ``lora_B`` (files without adapter metadata load at scale 1);
- original-name keys (Wan / ComfyUI: ``diffusion_model.blocks.0.self_attn.q.lora_down.weight``,
  ``lora_up``, ``alpha``), named through the family's ``names.to_original`` and
  ``names.export_prefix`` (:class:`~ditax.lora.names.LoraNames`).
"""

from __future__ import annotations

import pathlib

import numpy as np

from ditax.io.convert import Table
from ditax.lora.names import LoraNames

PEFT_FILE = "lora.safetensors"
ORIGINAL_FILE = "lora_comfyui.safetensors"


def adapter_factors(params: dict, table: Table) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Diffusers module name → (down ``[r, in]``, up ``[out, r]``) float32 of every adapter in
    ``params`` (numpy or addressable arrays)."""
    out = {}
    for row in table.rows:
        if row.path[-1] != "kernel":
            continue
        node = params
        for k in row.path[:-1]:
            node = node.get(k, {}) if isinstance(node, dict) else {}
        if not isinstance(node, dict) or "lora_down" not in node:
            continue
        down = np.asarray(node["lora_down"], np.float32)
        up = np.swapaxes(np.asarray(node["lora_up"], np.float32), -1, -2)
        names = [n.removesuffix(".weight") for n in table.names(row)]
        if row.stacked:
            out.update({n: (down[i], up[i]) for i, n in enumerate(names)})
        else:
            out[names[0]] = (down, up)
    return out


def peft_tensors(factors: dict, scale: float) -> dict[str, np.ndarray]:
    t = {}
    for m, (down, up) in factors.items():
        t[f"transformer.{m}.lora_A.weight"] = np.ascontiguousarray(down)
        t[f"transformer.{m}.lora_B.weight"] = np.ascontiguousarray(up * np.float32(scale))
    return t


def original_tensors(factors: dict, alpha: float, names: LoraNames) -> dict[str, np.ndarray]:
    t = {}
    for m, (down, up) in factors.items():
        o = names.export_prefix + names.to_original(m)
        t[f"{o}.lora_down.weight"] = np.ascontiguousarray(down)
        t[f"{o}.lora_up.weight"] = np.ascontiguousarray(up)
        t[f"{o}.alpha"] = np.asarray(alpha, np.float32)
    return t


def save_lora(folder, params: dict, table: Table, rank: int, alpha: float, *,
              names: LoraNames) -> list[pathlib.Path]:
    """Write :data:`PEFT_FILE` and :data:`ORIGINAL_FILE` (original names from ``names``, the
    family's) into ``folder``; returns their paths."""
    from safetensors.numpy import save_file

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    factors = adapter_factors(params, table)
    meta = {"format": "pt", "ditax_lora_rank": str(rank), "ditax_lora_alpha": str(alpha)}
    paths = [folder / PEFT_FILE, folder / ORIGINAL_FILE]
    save_file(peft_tensors(factors, alpha / rank), str(paths[0]), metadata=meta)
    save_file(original_tensors(factors, alpha, names), str(paths[1]), metadata=meta)
    return paths
