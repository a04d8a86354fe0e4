"""LoRA fine-tuning's split of the model: trainable adapters vs frozen base weights.

With ``cfg.lora.rank > 0`` the :class:`~ditax.train.step.Trainer` trains only the adapters
that :func:`ditax.lora.adapters.add_adapters` puts on the family's Linear layers: the train
state's ``params`` holds only them (so gradients and optimiser state exist only for them),
``frozen`` holds everything else (the base weights in ``model.param_dtype``, the adapters'
fixed scales and strengths). Both are sharded: the base weights as the family says, the
adapters like their kernels (:func:`~ditax.lora.adapters.adapter_shardings`).
"""

from __future__ import annotations

import jax
from flax import nnx

from ditax.config import ConfigError
from ditax.config.training import lora_targets
from ditax.lora.adapters import add_adapters, adapter_shardings
from ditax.lora.unmerged import LoraFactor


def _overlay(tree: dict, new: dict) -> dict:
    """``tree`` with the leaves of ``new`` (same paths) put in."""
    out = dict(tree)
    for k, v in new.items():
        out[k] = _overlay(tree[k], v) if isinstance(v, dict) else v
    return out


class AdapterSplit:
    """The model with adapters as (graphdef, trainable tree, frozen tree), their shardings,
    initialisation and re-assembly."""

    def __init__(self, family, cfg, mesh):
        self.table = family.lora_table()
        if self.table is None:
            raise ConfigError(f"lora.rank={cfg.lora.rank}: model family {family.name!r} has no "
                              f"LoRA support; use lora.rank=0")
        self.names = family.lora_names()
        self.rank = cfg.lora.rank
        self.alpha = float(cfg.lora.alpha or cfg.lora.rank)
        targets = lora_targets(cfg.lora)

        def build(seed: int):
            rngs = nnx.Rngs(seed)
            model = family.create(mesh, rngs)
            add_adapters(model, self.table, self.rank, self.alpha, targets, rngs,
                         names=self.names)
            return model

        self.graphdef, train_abs, frozen_abs = nnx.split(nnx.eval_shape(lambda: build(0)),
                                                         LoraFactor, ...)
        self._abs = (train_abs, frozen_abs)
        self.train_abstract = nnx.to_pure_dict(train_abs)
        self.frozen_abstract = nnx.to_pure_dict(frozen_abs)
        self.frozen_sh = family.param_shardings(self.frozen_abstract, mesh)
        self.train_sh = adapter_shardings(self.train_abstract, self.frozen_sh, mesh)

        def fresh(base):
            _, t, f = nnx.split(build(cfg.seed), LoraFactor, ...)
            return nnx.to_pure_dict(t), _overlay(nnx.to_pure_dict(f), base)

        # base weights given (init_from) go in as an argument: their random draws are dead
        # code XLA removes, so the program compiles only the adapters' init (the same values)
        self._fresh = jax.jit(fresh, out_shardings=(self.train_sh, self.frozen_sh))

    def init(self, base: dict | None = None) -> tuple[dict, dict]:
        """(adapters, frozen) from the seed; ``base``: base weights to freeze instead (a pure
        dict of the model without adapters, e.g. from ``init_from``)."""
        return self._fresh({} if base is None else base)

    def model(self, params: dict, frozen: dict):
        """An NNX module bound to adapters ``params`` and the ``frozen`` rest."""
        t, f = (jax.tree.map(lambda x: x, s) for s in self._abs)
        nnx.replace_by_pure_dict(t, params)
        nnx.replace_by_pure_dict(f, frozen)
        return nnx.merge(self.graphdef, t, f)

    def save(self, folder, params: dict):
        """Write the adapters as LoRA files (:func:`ditax.lora.export.save_lora`) from process 0;
        every process takes part in gathering sharded adapters."""
        from ditax.lora.export import save_lora

        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            params = multihost_utils.process_allgather(params, tiled=True)
        params = jax.tree.map(jax.device_get, params)
        if jax.process_index() == 0:
            return save_lora(folder, params, self.table, self.rank, self.alpha,
                             names=self.names)
        return []
