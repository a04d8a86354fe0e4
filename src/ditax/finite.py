"""Whether arrays hold only finite values, checked where they live: the load-time check of a
model's weights and the sampling loop's checks of its latents and output.

On CPU devices of one process the values already are in host memory: numpy reads each
distinct shard in place (replicas once). Anywhere else (accelerators, several processes) one
compiled program reduces every array on the devices that hold it and sends back one flag each.
Compiling that program (or two eager ops an array) costs more on CPU than reading the values:
~0.2-0.3 s for a small model's set of shapes and shardings, once per shape in every process.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def _finite_flags(leaves: list) -> jax.Array:
    """One flag a tensor (every value finite), all in one program: two eager ops a tensor
    compiled once per shape and synced one by one (~2 s of compiles for a small model)."""
    return jnp.stack([jnp.isfinite(x).all() for x in leaves])


def on_host(leaves: list) -> bool:
    """Every shard of the jax arrays ``leaves`` is in this process's CPU memory (one process)."""
    return jax.process_count() == 1 and all(
        d.platform == "cpu" for leaf in leaves for d in leaf.sharding.device_set)


def _host_finite_flags(leaves: list) -> list[bool]:
    """:func:`finite_flags` by numpy over each distinct shard (replicas once)."""
    return [all(bool(np.isfinite(np.asarray(s.data)).all())
                for s in leaf.addressable_shards if s.replica_id == 0) for leaf in leaves]


def finite_flags(leaves: list) -> list[bool]:
    """For each float jax array of ``leaves``: whether every value is finite (the module
    docstring says where it is computed)."""
    if not leaves:
        return []
    if on_host(leaves):
        return _host_finite_flags(leaves)
    return [bool(f) for f in np.asarray(_finite_flags(leaves))]


def all_finite(x) -> bool:
    """Every value of ``x`` (a jax or numpy float array) is finite."""
    if isinstance(x, jax.Array):
        return finite_flags([x])[0]
    return bool(np.isfinite(np.asarray(x)).all())


__all__ = ["all_finite", "finite_flags", "on_host"]
