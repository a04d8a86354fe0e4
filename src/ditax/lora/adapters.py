"""Trainable LoRA adapters for fine-tuning: which Linear layers, fresh factors, their shardings.

:func:`target_modules` picks the Linear layers of a model's weight table by target group
(``lora.targets``: ``attn``, ``ffn`` …), each group a list of module-path patterns the family
supplies (:attr:`ditax.lora.names.LoraNames.targets`, matched on our dotted module paths).
:func:`add_adapters` replaces each by a :class:`~ditax.lora.unmerged.LoraLinear` whose factors
``down [(L,) r, in]`` / ``up [(L,) r, out]`` are :class:`~ditax.lora.unmerged.LoraFactor`
(trainable) with PEFT's start — ``down`` uniform in ``±1/sqrt(in)``, ``up`` zero, so training
starts from the base model — ``scale = alpha / r`` and strength 1 (both constants).
:func:`adapter_shardings`: ``down`` is split like the kernel's input axis, ``up`` like its output
axis (a head-major kernel's heads), the layer axis like the kernel's, the rank never. A factor
whose axis the kernel leaves whole takes the kernel's one split axis instead where it divides
(FSDP splits one axis of each kernel: else that factor, and its optimiser moments, would sit
whole on every device: LTX-2 rank 64 on fsdp 8, 1.54 GB of adapters a chip instead of 0.31).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.io.convert import Table, linear_weight
from ditax.lora.names import LoraNames
from ditax.lora.unmerged import LoraFactor, LoraLinear


def target_modules(table: Table, targets, names: LoraNames) -> list[tuple[str, ...]]:
    """Our module paths (``("blocks", "attn1", "to_q")``) of the Linear layers that a pattern
    of the target groups ``targets`` (``names.targets``) matches, in the table's order."""
    patterns = names.target_patterns(targets)
    out = []
    for row in table.rows:
        if row.path[-1] != "kernel" or not linear_weight(row.transform):
            continue
        if any(p.fullmatch(".".join(row.path[:-1])) for p in patterns):
            out.append(row.path[:-1])
    return out


def add_adapters(module, table: Table, rank: int, alpha: float, targets, rngs, *,
                 names: LoraNames) -> int:
    """Replace the Linear layers of ``module`` in the target groups ``targets`` (the family's
    ``names``) by LoRA-carrying ones (in place, also on an abstract module under
    ``nnx.eval_shape``); returns how many."""
    paths = target_modules(table, targets, names)
    for path in paths:
        parent = module
        for name in path[:-1]:
            parent = getattr(parent, name)
        base = getattr(parent, path[-1])
        lead, din, dout = base.dims()
        bound = 1.0 / math.sqrt(din)
        down = jax.random.uniform(rngs.params(), lead + (rank, din), jnp.float32, -bound, bound)
        up = jnp.zeros(lead + (rank, dout), jnp.float32)
        scale = jnp.full(lead + (rank,), alpha / rank, jnp.float32)
        strength = jnp.ones(lead + (1,), jnp.float32)
        setattr(parent, path[-1], LoraLinear(base, down, up, scale, (0,) * rank, None, strength,
                                             factor=LoraFactor))
    return len(paths)


def _node(tree: dict, path):
    for k in path:
        tree = tree[k]
    return tree


def _size(mesh, entry) -> int:
    """Devices a ``PartitionSpec`` entry (an axis name or a tuple of them) splits over."""
    return math.prod(mesh.shape[n] for n in (entry if isinstance(entry, tuple) else (entry,)))


def adapter_shardings(adapters: dict, frozen_sh: dict, mesh) -> dict:
    """Shardings of the adapter tree (``{…module…: {lora_down, lora_up}}``) from the shardings
    of the frozen tree that holds each module's ``kernel``."""
    def one(path, leaf):
        keys = tuple(getattr(p, "key", p) for p in path)
        spec = tuple(_node(frozen_sh, keys[:-1] + ("kernel",)).spec)
        spec = spec + (None,) * (len(leaf.shape) - len(spec))
        heads = len(spec) > len(leaf.shape)       # a head-major kernel [(L,) N, in, K]
        axis = spec[-2] if keys[-1] == "lora_down" else spec[-3 if heads else -1]
        lead = len(leaf.shape) - 2
        split = [a for a in spec[lead:] if a is not None]
        if axis is None and len(split) == 1 and leaf.shape[-1] % _size(mesh, split[0]) == 0:
            axis = split[0]
        return NamedSharding(mesh, P(*spec[:lead], None, axis))

    return jax.tree_util.tree_map_with_path(one, adapters)
