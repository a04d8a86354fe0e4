"""The shared mechanics of a row-split (spatially parallel) VAE program: which devices, how many
rows each, padding odd heights, and running a body under ``jax.shard_map`` with the split active.

A VAE's frames are split by their rows (height) over every device of the mesh (all of its axes
together, in mesh order); the layers exchange halos and share statistics through
:mod:`ditax.nn.halo`. Each device holds ``ceil(Y / devices)`` latent rows; the bottom of the
frame is padded with zero rows up to ``devices`` times that and the padding is cropped off the
result. Per-device activations fall with the device count; the weights are replicated.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ditax.errors import RequestError
from ditax.nn import halo


def make_split(mesh, rows: int, what: str) -> halo.RowSplit:
    """The :class:`~ditax.nn.halo.RowSplit` of ``rows`` latent rows over all of ``mesh``'s
    devices; ``what`` names the caller in errors."""
    if not isinstance(mesh, Mesh):
        raise RequestError(f"{what}: parallel decode / encode needs a jax.sharding.Mesh, got "
                           f"{type(mesh).__name__}; pass mesh=ditax.parallel.make_mesh(...) or "
                           "decode on one device without mesh.")
    if rows < 1:
        raise RequestError(f"{what}: {rows} latent rows cannot be split; give a non-empty frame.")
    axes = tuple(a for a in mesh.axis_names if mesh.shape[a] > 1) or tuple(mesh.axis_names[:1])
    n = math.prod(mesh.shape[a] for a in axes)
    return halo.RowSplit(axes, n, rows, -(-rows // n))


def row_spec(split: halo.RowSplit, row_axis: int, ndim: int) -> P:
    """``PartitionSpec`` of an array of rank ``ndim`` whose axis ``row_axis`` is split."""
    entries = [None] * ndim
    entries[row_axis] = split.axis
    return P(*entries)


def pad_rows(x: jax.Array, split: halo.RowSplit, scale: int, row_axis: int) -> jax.Array:
    """``x`` with rows at ``scale`` x the latent resolution, zero-padded at the bottom to
    ``devices * local_rows * scale``."""
    extra = split.devices * split.local_rows * scale - x.shape[row_axis]
    if extra == 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[row_axis] = (0, extra)
    return jnp.pad(x, pad)


def sharded(body, mesh: Mesh, split: halo.RowSplit, in_specs, out_specs):
    """``body`` under ``jax.shard_map`` on ``mesh`` with ``split`` active while it traces."""

    def traced(*args):
        with halo.row_split(split):
            return body(*args)

    return jax.shard_map(traced, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=False)


__all__ = ["make_split", "pad_rows", "row_spec", "sharded"]
