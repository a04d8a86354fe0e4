"""Partly frozen training's split of the model (:class:`ParamSplit`): LoRA's trainable
adapters vs frozen base weights, or the parameters a model family trains (a VACE model: its
VACE branch, :meth:`~ditax.models.base.ModelFamily.trained_params`) vs the frozen rest.

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


def _pick(tree: dict, like: dict) -> dict:
    """The entries of ``tree`` at the paths ``like`` has (those ``tree`` holds)."""
    out = {}
    for k, v in like.items():
        if k in tree:
            out[k] = _pick(tree[k], v) if isinstance(v, dict) else tree[k]
    return out


class ParamSplit:
    """A model as (graphdef, trainable tree, frozen tree) by an ``nnx`` filter ``trained``,
    their shardings, initialisation and re-assembly: the train state's ``params`` holds only
    the trained leaves (so gradients and optimiser state exist only for them), ``frozen`` the
    rest. ``build(seed)`` makes the module; ``train_sh(train_abstract, frozen_sh)`` the trained
    leaves' shardings (None: the family's parameter shardings)."""

    def __init__(self, family, cfg, mesh, build, trained, train_sh=None):
        self.graphdef, train_abs, frozen_abs = nnx.split(nnx.eval_shape(lambda: build(0)),
                                                         trained, ...)
        self._abs = (train_abs, frozen_abs)
        self.train_abstract = nnx.to_pure_dict(train_abs)
        self.frozen_abstract = nnx.to_pure_dict(frozen_abs)
        self.frozen_sh = family.param_shardings(self.frozen_abstract, mesh)
        self.train_sh = (family.param_shardings(self.train_abstract, mesh) if train_sh is None
                         else train_sh(self.train_abstract, self.frozen_sh))

        def fresh(base):
            _, t, f = nnx.split(build(cfg.seed), trained, ...)
            t, f = nnx.to_pure_dict(t), nnx.to_pure_dict(f)
            return _overlay(t, _pick(base, t)), _overlay(f, _pick(base, f))

        # weights given (init_from) go in as an argument: their random draws are dead code XLA
        # removes, so the program compiles only the init of what the base does not hold
        self._fresh = jax.jit(fresh, out_shardings=(self.train_sh, self.frozen_sh))

    def init(self, base: dict | None = None) -> tuple[dict, dict]:
        """(trained, frozen) from the seed; ``base``: a pure dict of the model's weights to
        start from instead (e.g. from ``init_from``; LoRA: the model without adapters)."""
        return self._fresh({} if base is None else base)

    def model(self, params: dict, frozen: dict, graphdef=None):
        """An NNX module bound to the trained ``params`` and the ``frozen`` rest (on
        ``graphdef``, another graph over the same parameters, where given)."""
        t, f = (jax.tree.map(lambda x: x, s) for s in self._abs)
        nnx.replace_by_pure_dict(t, params)
        nnx.replace_by_pure_dict(f, frozen)
        return nnx.merge(self.graphdef if graphdef is None else graphdef, t, f)


class AdapterSplit(ParamSplit):
    """LoRA: the adapters trained, the base weights (and the adapters' fixed scales and
    strengths) frozen; the adapters sharded like their kernels."""

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

        super().__init__(family, cfg, mesh, build, LoraFactor,
                         lambda t, f: adapter_shardings(t, f, mesh))

    def save(self, folder, params: dict, sample: dict | None = None):
        """Write the adapters as LoRA files (:func:`ditax.lora.export.save_lora`) from process 0;
        every process takes part in gathering sharded adapters. ``sample``: the sampling
        settings they were trained for (a few-step student's), carried by the files."""
        from ditax.lora.export import save_lora

        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            params = multihost_utils.process_allgather(params, tiled=True)
        params = jax.tree.map(jax.device_get, params)
        if jax.process_index() == 0:
            if sample is not None:     # checked against the pipelines' rules first
                from ditax.pipelines.lora_sample import save_student_lora

                return save_student_lora(folder, params, self.table, self.rank, self.alpha,
                                         names=self.names, sample=sample)
            return save_lora(folder, params, self.table, self.rank, self.alpha,
                             names=self.names)
        return []
