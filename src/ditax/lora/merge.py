"""Merged LoRA: the updates are folded into the base weights as they are read, slice by slice.

:func:`plan_patches` checks every LoRA row against the model's upstream (diffusers) tensor keys
and shapes — a target the model lacks, a block index past its layer count, or a width that
does not fit raises one :class:`WeightError` for the file — and returns, per tensor key, the
additive :class:`Patch` es. :class:`PatchedWeights` wraps a :class:`~ditax.io.weights.Weights`
so that ``read(key, index)`` returns ``stored[index] + Σ patch[index]``: the loader
(:func:`ditax.io.convert.load_params`) reads each device's shard on its own, so each device
computes only its slice of ``up @ down`` (``up[out slice] @ down[:, in slice]``), on the host,
in float32, and no full copy of a weight or an update is made anywhere.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from ditax.errors import WeightError
from ditax.io.convert import Table, listing
from ditax.lora.names import LoraNames
from ditax.lora.table import Lora, LoraRow


@dataclasses.dataclass(frozen=True, eq=False)
class Patch:
    """``factor * up @ down`` (``[out, r] @ [r, in]``) or ``factor * delta``, added to one
    upstream tensor."""

    factor: float
    down: np.ndarray | None = None
    up: np.ndarray | None = None
    delta: np.ndarray | None = None

    def block(self, index: tuple) -> np.ndarray:
        """The update's ``[index]`` (a full tuple of slices of the upstream tensor), float32."""
        if self.delta is not None:
            return np.float32(self.factor) * self.delta[index].astype(np.float32)
        rows, cols = index
        up = self.up[rows].astype(np.float32)
        return (np.float32(self.factor) * up) @ self.down[:, cols].astype(np.float32)


def upstream_shapes(table: Table, shapes: dict) -> dict[str, tuple[int, ...]]:
    """Every upstream key of ``table`` → its upstream shape (``shapes``: our path → shape)."""
    out = {}
    for row in table.rows:
        ours = tuple(shapes[row.path])[1:] if row.stacked else tuple(shapes[row.path])
        theirs = row.transform.theirs_shape(ours)
        out.update({k: theirs for k in table.names(row)})
    return out


def _layers(keys, layer_key: str) -> int:
    block = re.compile(layer_key)
    return 1 + max((int(m.group(1)) for k in keys if (m := block.match(k))), default=-1)


def _row_patches(row: LoraRow, strength: float, targets: dict, problems: list) -> list:
    """(tensor key, Patch) of one row; problems are appended to ``problems``."""
    weight = row.key + ".weight" if row.key + ".weight" in targets else row.key
    out = []
    if row.down is not None or row.diff is not None:
        want = targets.get(weight)
        if want is None:
            problems.append(f"{row.key}: no such weight in this transformer")
        elif row.down is not None:
            got = (row.up.shape[0], row.down.shape[1])
            if len(want) != 2 or tuple(want) != got:
                problems.append(f"{row.key}: lora_up {tuple(row.up.shape)} @ lora_down "
                                f"{tuple(row.down.shape)} is {got}, the model's weight is "
                                f"{tuple(want)}")
            else:
                out.append((weight, Patch(strength * row.scale, row.down, row.up)))
        if want is not None and row.diff is not None:
            if tuple(row.diff.shape) != tuple(want):
                problems.append(f"{row.key}: diff {tuple(row.diff.shape)}, the model's weight is "
                                f"{tuple(want)}")
            else:
                out.append((weight, Patch(strength, delta=row.diff)))
    if row.bias is not None:
        want = targets.get(row.key + ".bias")
        if want is None:
            problems.append(f"{row.key}: has a bias delta but no bias in this transformer")
        elif tuple(row.bias.shape) != tuple(want):
            problems.append(f"{row.key}: bias delta {tuple(row.bias.shape)}, the model's bias "
                            f"is {tuple(want)}")
        else:
            out.append((row.key + ".bias", Patch(strength, delta=row.bias)))
    return out


def plan_patches(loras: list[tuple[Lora, float]], targets: dict,
                 context: str = "this transformer", *,
                 names: LoraNames | None = None) -> dict[str, list[Patch]]:
    """Upstream key → the patches to add (``targets``: :func:`upstream_shapes`; ``names``: the
    family's, for its block names and its hint in messages).

    Raises one :class:`WeightError` per LoRA that does not fit the model, naming each key with
    both shapes (or the layer count when the LoRA has more blocks than the model).
    """
    patches: dict[str, list[Patch]] = {}
    layer_key = LoraNames.layer_key if names is None else names.layer_key
    hint = LoraNames.mismatch_hint if names is None else names.mismatch_hint
    model_layers = _layers(targets, layer_key)
    for lora, strength in loras:
        problems: list[str] = []
        lora_layers = _layers((r.key for r in lora.rows), layer_key)
        if lora_layers > model_layers:
            problems.append(f"it has blocks up to {lora_layers - 1}, the model has "
                            f"{model_layers} (blocks 0..{model_layers - 1})")
        found = [p for row in lora.rows for p in _row_patches(row, strength, targets, problems)]
        if problems:
            raise WeightError(f"{lora.source}: the LoRA does not fit {context}: "
                              f"{listing(problems, '; ')}; {hint}")
        if strength == 0:
            continue
        for key, patch in found:
            patches.setdefault(key, []).append(patch)
    return patches


class PatchedWeights:
    """A :class:`~ditax.io.weights.Weights` whose tensors come back with patches added
    (float32 where patched; stored dtype elsewhere). Everything else is the wrapped object's.

    ``patches`` is keyed by the keys the loader reads (the wrapped checkpoint's names).
    """

    def __init__(self, weights, patches: dict[str, list[Patch]]):
        self._inner = weights
        self._patches = patches

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __contains__(self, key) -> bool:
        return key in self._inner

    def __len__(self) -> int:
        return len(self._inner)

    def get(self, key: str) -> np.ndarray:
        return self.read(key, ())

    def read(self, key: str, index: tuple) -> np.ndarray:
        x = self._inner.read(key, index)
        patches = self._patches.get(key)
        if not patches:
            return x
        ndim = len(self._inner.shape(key))
        full = tuple(index) + (slice(None),) * (ndim - len(index))
        out = x.astype(np.promote_types(x.dtype, np.float32))
        for p in patches:
            out += p.block(full)
        return out
