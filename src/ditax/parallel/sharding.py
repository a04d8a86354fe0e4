"""The one sharding context a model hands its layers: the mesh and the questions layers ask it.

A model builds one :class:`ShardingContext` from its mesh and passes that same object to its
blocks and its attention calls; no layer keeps a mesh of its own. Layers speak logical axes
(:mod:`ditax.parallel.rules`) and ask sizes through it, so the mesh's axis names stay inside
``parallel/``. Without a mesh (one device) every constraint is a no-op and every size is 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ditax.parallel.axes import batch_entry, check_batch_divides, check_heads_divide, seq_shards
from ditax.parallel.rules import constrain


@dataclass(frozen=True)
class ShardingContext:
    """A model's mesh (None: one device) and what its layers do with it.

    Frozen and hashable (a static attribute of the module, part of its graph): two contexts on
    equal meshes are equal.
    """

    mesh: Optional[Mesh] = None

    def constrain(self, x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
        """``x`` constrained to the activation rules of ``logical_axes`` (one name per
        dimension, None = unsharded); unchanged without a mesh."""
        return constrain(x, logical_axes, self.mesh)

    @property
    def seq_shards(self) -> int:
        """How many ways the token sequence is split (sequences are padded to a multiple)."""
        return seq_shards(self.mesh)

    def check_batch(self, batch: int, what: str = "batch") -> None:
        """:class:`~ditax.errors.ConfigError` unless ``batch`` splits over the batch shards."""
        check_batch_divides(batch, self.mesh, what)

    def check_heads(self, num_heads: int, what: str = "model.num_attention_heads") -> None:
        """:class:`~ditax.errors.ConfigError` unless ``num_heads`` splits over the head
        shards."""
        check_heads_divide(num_heads, self.mesh, what)

    def put_batch(self, x, batch_axis: int = 0):
        """``x`` on the mesh with dimension ``batch_axis`` split over the batch shards (the rest
        replicated); unchanged without a mesh or for None."""
        if self.mesh is None or x is None:
            return x
        spec = [None] * x.ndim
        spec[batch_axis] = batch_entry(self.mesh)
        return jax.device_put(x, NamedSharding(self.mesh, P(*spec)))


def sharding_context(mesh_or_context) -> ShardingContext:
    """The :class:`ShardingContext` of a mesh (or None); a context is returned as it is, so
    whoever passes the model's context on shares that one object."""
    if isinstance(mesh_or_context, ShardingContext):
        return mesh_or_context
    return ShardingContext(mesh_or_context)


__all__ = ["ShardingContext", "sharding_context"]
