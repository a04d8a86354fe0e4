"""Device mesh ``(data, fsdp, context, tensor)`` and multi-host initialisation.

The mesh is always built here and passed explicitly (never read from a global).
"""

from __future__ import annotations

import logging

import jax
import numpy as np
from jax.sharding import Mesh

from ditax.config import MESH_AXES, MeshConfig, resolve_mesh_shape

log = logging.getLogger(__name__)


def initialize_distributed(cfg: MeshConfig) -> bool:
    """Start ``jax.distributed`` when the config names a coordinator. Call at the entry point.

    Returns True when a multi-process runtime was initialised here. On a single process with no
    coordinator configured this does nothing.
    """
    if cfg.coordinator_address is None:
        return False
    if cfg.num_processes is None or cfg.process_id is None:
        raise ValueError(
            f"mesh.coordinator_address={cfg.coordinator_address!r} needs mesh.num_processes and "
            f"mesh.process_id too (got {cfg.num_processes}, {cfg.process_id})")
    jax.distributed.initialize(cfg.coordinator_address, num_processes=cfg.num_processes,
                               process_id=cfg.process_id)
    log.info("jax.distributed: process %d/%d, %d local / %d global devices", cfg.process_id,
             cfg.num_processes, jax.local_device_count(), jax.device_count())
    return True


def make_mesh(cfg: MeshConfig | dict | None = None, devices=None) -> Mesh:
    """A 4-axis mesh from config sizes (one may be -1 = all remaining devices).

    ``devices`` defaults to ``jax.devices()``. Device order follows
    ``jax.experimental.mesh_utils.create_device_mesh`` where it applies (ICI-aware on TPU/GPU),
    with ``tensor`` and ``context`` innermost so their collectives stay on the fastest links.
    """
    if cfg is None:
        cfg = MeshConfig()
    if isinstance(cfg, dict):
        cfg = MeshConfig(**{**dict(data=1, fsdp=1, context=1, tensor=1), **cfg})
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_mesh_shape(cfg, len(devices))
    shape = tuple(sizes[a] for a in MESH_AXES)
    try:
        from jax.experimental import mesh_utils

        if devices[0].platform in ("tpu", "gpu") and jax.process_count() == 1:
            arr = mesh_utils.create_device_mesh(shape, devices=devices)
        else:
            arr = np.asarray(devices, dtype=object).reshape(shape)
    except Exception:  # topology helpers can refuse unusual shapes; a plain reshape is valid
        arr = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(arr, MESH_AXES)


def axis_size(mesh: Mesh | None, axis: str | tuple[str, ...] | None) -> int:
    """Product of the sizes of one or more mesh axes (1 for None or no mesh)."""
    if mesh is None or axis is None:
        return 1
    if isinstance(axis, str):
        axis = (axis,)
    n = 1
    for a in axis:
        n *= mesh.shape[a]
    return n
