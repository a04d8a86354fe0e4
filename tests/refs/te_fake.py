"""A stand-in for ``transformer_engine.jax`` (CUDA-only, not installable here) that records how
ditax calls it. It mirrors the TE 2.x surface ditax uses — ``flax.DotProductAttention``,
``attention.SequenceDescriptor.from_seqlens``, ``sharding.MeshResource`` /
``global_shard_guard`` / ``global_mesh_resource`` — and computes attention with the reference
from the sequence lengths it is given, so a wrong descriptor gives a wrong answer. It tests
ditax's wrapper, not TE.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.machinery
import sys
import types

import jax.numpy as jnp

from ditax.attention.reference import reference_attention

CALLS: list[dict] = []
_RESOURCE: list = [None]


class SequenceDescriptor:
    def __init__(self, seqlens):
        self.seqlens = seqlens

    @classmethod
    def from_seqlens(cls, seqlens):
        q, kv = seqlens
        return cls((q, kv))


@dataclasses.dataclass
class MeshResource:
    dp_resource: str = None
    tp_resource: str = None
    tpsp_resource: str = None
    fsdp_resource: str = None
    pp_resource: str = None
    cp_resource: str = None


@contextlib.contextmanager
def global_shard_guard(resource):
    old = _RESOURCE[0]
    _RESOURCE[0] = resource
    try:
        yield
    finally:
        _RESOURCE[0] = old


def global_mesh_resource():
    assert _RESOURCE[0] is not None, "Global mesh resource is not set."
    return _RESOURCE[0]


class DotProductAttention:
    """Records ``kwargs`` and the call; BSHD reference attention over the given lengths."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def apply(self, variables, query, key, value, sequence_descriptor=None, bias=None, *,
              deterministic=False, mask=None):
        assert isinstance(sequence_descriptor, SequenceDescriptor), type(sequence_descriptor)
        CALLS.append(dict(kwargs=self.kwargs, variables=variables, descriptor=sequence_descriptor,
                          bias=bias, mask=mask, deterministic=deterministic,
                          shapes=(query.shape, key.shape, value.shape)))
        q_len, kv_len = sequence_descriptor.seqlens
        keep = jnp.arange(key.shape[1])[None, :] < kv_len[:, None]
        o = reference_attention(query, key, value, kv_mask=keep,
                                scale=self.kwargs["scale_factor"])
        rows = jnp.arange(query.shape[1])[None, :] < q_len[:, None]
        return jnp.where(rows[:, :, None, None], o, 0).astype(query.dtype)


def install(monkeypatch) -> list[dict]:
    """Put the fake package into ``sys.modules`` (undone by monkeypatch); returns CALLS."""
    from ditax.attention import platform

    names = ("transformer_engine", "transformer_engine.jax", "transformer_engine.jax.flax",
             "transformer_engine.jax.attention", "transformer_engine.jax.sharding")
    mods = {}
    for name in names:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mods[name] = mod
        monkeypatch.setitem(sys.modules, name, mod)
    mods["transformer_engine.jax.flax"].DotProductAttention = DotProductAttention
    mods["transformer_engine.jax.attention"].SequenceDescriptor = SequenceDescriptor
    sh = mods["transformer_engine.jax.sharding"]
    sh.MeshResource, sh.global_shard_guard = MeshResource, global_shard_guard
    sh.global_mesh_resource = global_mesh_resource
    platform.module_available.cache_clear()   # the caller clears it again after the test
    CALLS.clear()
    _RESOURCE[0] = None
    return CALLS
