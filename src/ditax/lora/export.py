"""Trained adapters → LoRA files that diffusers, ComfyUI and ditax load.

:func:`adapter_factors` reads the ``lora_down [(L,) r, in]`` / ``lora_up [(L,) r, out]`` of a
trained parameter tree and names them by the model's weight table (diffusers module names,
one per layer). Two files are written:

- diffusers / PEFT keys (``transformer.blocks.0.attn1.to_q.lora_A.weight``, ``lora_B``), the
  scale ``alpha / r`` folded into ``lora_B`` (files without adapter metadata load at scale 1);
- original-name keys (Wan / ComfyUI: ``diffusion_model.blocks.0.self_attn.q.lora_down.weight``,
  ``lora_up``, ``alpha``; Flux: kohya ``lora_unet_double_blocks_0_img_attn_qkv``), named
  through the family's ``names.to_original``, ``export_prefix`` and ``export_sep``
  (:class:`~ditax.lora.names.LoraNames`); a fused original layer gets its members' factors
  in one (:func:`_fuse`).

``sample`` (a few-step student's sampling settings, e.g. ``{"num_inference_steps": 4,
"guidance_scale": 1.0, "scheduler": "euler", "flow_shift": 5.0, "sigmas": [1.0, 0.75, 0.5,
0.25]}``) goes into both files' safetensors metadata as JSON under ``ditax_sample`` and into
``ditax_sample.json`` beside them; a pipeline that loads such a file samples with them where
the caller gives none (:mod:`ditax.pipelines.lora_sample`).

The files are written under temporary names and renamed together when all are whole
(:func:`ditax.io.outputs.staged`): a failed write (the disk full, a quota) is
:class:`~ditax.io.outputs.WriteFailed` naming the file, and the files that were there before
stay as they were.
"""

from __future__ import annotations

import pathlib

import numpy as np

from ditax.io.convert import Table
from ditax.lora.names import LoraNames

PEFT_FILE = "lora.safetensors"
META_KEY = "ditax_sample"              # the metadata key of the sampling settings
SAMPLE_FILE = "ditax_sample.json"      # = ditax.pipelines.sample_defaults.FILE
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


def _fuse(pieces, members: dict, alpha: float):
    """One fused layer's (down, up, alpha) from its members' factors: the downs stacked along
    the rank, each member's up in its own rows and rank columns (zero elsewhere: a member
    without an adapter adds nothing), alpha scaled with the rank so ``alpha / r`` stays."""
    order = list(dict.fromkeys(m for m, _, _ in pieces if m in members))
    units = {m: sum(b - a for n, a, b in pieces if n == m) for m in order}
    d = members[order[0]][1].shape[0] // units[order[0]]
    cols, at = {}, 0
    for m in order:
        cols[m] = slice(at, at + members[m][0].shape[0])
        at += members[m][0].shape[0]
    up = np.zeros((sum(b - a for _, a, b in pieces) * d, at), np.float32)
    row = 0
    for m, a, b in pieces:
        if m in members:
            up[row:row + (b - a) * d, cols[m]] = members[m][1][a * d:b * d]
        row += (b - a) * d
    down = np.concatenate([members[m][0] for m in order], axis=0)
    return down, up, alpha * at / members[order[0]][0].shape[0]


def original_tensors(factors: dict, alpha: float, names: LoraNames) -> dict[str, np.ndarray]:
    groups: dict[str, dict] = {}
    for m, f in factors.items():
        groups.setdefault(names.to_original(m), {})[m] = f
    t = {}
    for orig, members in groups.items():
        pieces = names.fused(orig) if names.fused is not None else None
        if pieces:
            down, up, a = _fuse(pieces, members, alpha)
        else:
            (down, up), a = next(iter(members.values())), alpha
        o = names.export_prefix + orig.replace(".", names.export_sep)
        t[f"{o}.lora_down.weight"] = np.ascontiguousarray(down)
        t[f"{o}.lora_up.weight"] = np.ascontiguousarray(up)
        t[f"{o}.alpha"] = np.asarray(a, np.float32)
    return t


def save_lora(folder, params: dict, table: Table, rank: int, alpha: float, *,
              names: LoraNames, sample: dict | None = None) -> list[pathlib.Path]:
    """Write :data:`PEFT_FILE` and :data:`ORIGINAL_FILE` (original names from ``names``, the
    family's) into ``folder``; returns their paths. ``sample``: the sampling settings the
    adapters were trained for (module docstring), already checked
    (:func:`ditax.pipelines.lora_sample.save_student_lora` checks, then calls this), stored in
    both files' metadata and written as :data:`SAMPLE_FILE` beside them."""
    import json

    from safetensors.numpy import save_file

    from ditax.io.outputs import staged

    folder = pathlib.Path(folder)
    factors = adapter_factors(params, table)
    meta = {"format": "pt", "ditax_lora_rank": str(rank), "ditax_lora_alpha": str(alpha)}
    if sample is not None:
        meta[META_KEY] = json.dumps(sample)
    paths = [folder / PEFT_FILE, folder / ORIGINAL_FILE]
    with staged() as stage:     # every file whole, renamed together (or none)
        save_file(peft_tensors(factors, alpha / rank), str(stage.file(paths[0])), metadata=meta)
        save_file(original_tensors(factors, alpha, names), str(stage.file(paths[1])),
                  metadata=meta)
        if sample is not None:
            write_sample(folder, sample, stage)
    return paths


def write_sample(folder, sample: dict, stage=None) -> pathlib.Path:
    """Write the sampling settings ``sample`` as ``folder/``:data:`SAMPLE_FILE` whole
    (:func:`~ditax.io.outputs.atomic_file`; renamed with the other outputs of ``stage``, a
    :class:`~ditax.io.outputs.Staging`, when given); returns its path. A failed write is
    :class:`~ditax.io.outputs.WriteFailed` naming it."""
    import json

    from ditax.io.outputs import atomic_file

    path = pathlib.Path(folder) / SAMPLE_FILE
    text = json.dumps(sample, indent=2) + "\n"
    with atomic_file(path, stage) as tmp:
        tmp.write_text(text)
    return path
