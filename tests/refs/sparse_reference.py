"""References for training a sparse model (``attention.sparsity``): the model of an attention
config built as a fresh graph (no shared graphdef with the trainer) and bound to given weights,
the dense config of a sparse one, and the VSA gates' entries of a parameter tree. The DMD2
sparse-student tests and the dense-teacher flow tests compare the trainers' calls with them."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.models.base import model_family

GATE = "to_gate_compress"


def paths(tree, prefix=()):
    """``{path: leaf}`` of a nested dict."""
    out = {}
    for k, v in tree.items():
        out.update(paths(v, prefix + (k,)) if isinstance(v, dict) else {prefix + (k,): v})
    return out


def gates(tree):
    return {p: v for p, v in paths(tree).items() if GATE in p}


def without_gates(tree):
    """``tree`` with the gate entries dropped (the dense model has no such parameters)."""
    if not isinstance(tree, dict):
        return tree
    return {k: without_gates(v) for k, v in tree.items() if k != GATE}


def reference(cfg, attention, params, x, sigma, batch):
    """The model of ``attention`` (a fresh graph) on ``params``, through ``family.apply``."""
    family = model_family(cfg.model, attention, cfg.flow)
    graphdef, st = nnx.split(family.abstract(None))
    nnx.replace_by_pure_dict(st, params)
    t = sigma * 1000.0
    return family.apply(nnx.merge(graphdef, st), x, t, jnp.asarray(batch["text"]),
                        jnp.asarray(batch["text_mask"]).astype(bool), None)


def dense_attention(a):
    return dataclasses.replace(a, sparsity="none", topk=0, tile=type(a)().tile)


def perturb(tree, seed, scale=0.05):
    """``tree`` with each leaf moved by ``scale`` times fresh normal noise (numpy leaves)."""
    leaves, tdef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tdef, [np.asarray(v + scale * jax.random.normal(k, v.shape))
                                     for v, k in zip(leaves, keys)])


def config_refusal(overrides) -> str:
    """The one-line :class:`~ditax.errors.ConfigError` ``ditax.validate`` raises for the
    ``tiny`` preset with ``overrides`` on 8 devices (fails if none is raised, or its message
    spans more than one line)."""
    import pytest

    from ditax.config import load_config, validate
    from ditax.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        validate(load_config("tiny", overrides), num_devices=8)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)

