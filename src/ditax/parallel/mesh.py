"""Device mesh ``(data, fsdp, context, tensor)`` and multi-host initialisation.

The mesh is always built here and passed explicitly (never read from a global).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Mapping, Optional

import jax
import numpy as np
from jax.sharding import Mesh

from ditax.errors import ConfigError

log = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "context", "tensor")
BATCH_AXES = ("data", "fsdp")     # the axes that split the batch
SEQ_AXIS = "context"              # the sequence-parallel axis (Ulysses / ring)
HEADS_AXIS = "tensor"             # heads / MLP columns


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh ``(data, fsdp, context, tensor)``; one size may be -1 (= the rest).

    data: pure replicas. fsdp: batch-sharded ZeRO-3 (params sharded, batch sharded).
    context: sequence-sharded (Ulysses / ring). tensor: heads and MLP columns.
    """

    data: int = 1
    fsdp: int = -1
    context: int = 1
    tensor: int = 1
    # Multi-host (jax.distributed). None = single process, or auto-detected on TPU/SLURM.
    coordinator_address: Optional[str] = None
    num_processes: Optional[int] = None
    process_id: Optional[int] = None


def resolve_mesh_shape(mesh: MeshConfig, num_devices: int) -> dict[str, int]:
    """Sizes of the four mesh axes with a -1 resolved; errors name the numbers and the fix."""
    sizes = {a: getattr(mesh, a) for a in MESH_AXES}
    bad = {a: s for a, s in sizes.items() if s == 0 or s < -1}
    if bad:
        raise ConfigError(f"mesh sizes must be >= 1 or -1 (= the remaining devices); got {bad}")
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
        raise ConfigError(f"at most one mesh axis may be -1; got {free} = -1. Set all but one.")
    fixed = 1
    for a, s in sizes.items():
        if s != -1:
            fixed *= s
    if free:
        if num_devices % fixed:
            raise ConfigError(
                f"mesh {sizes}: the fixed axes multiply to {fixed}, which does not divide the "
                f"{num_devices} devices; choose sizes whose product divides {num_devices}")
        sizes[free[0]] = num_devices // fixed
    prod = 1
    for s in sizes.values():
        prod *= s
    if prod != num_devices:
        raise ConfigError(
            f"mesh data*fsdp*context*tensor = {'*'.join(str(sizes[a]) for a in MESH_AXES)} = "
            f"{prod}, but there are {num_devices} devices; make the product {num_devices} "
            f"or set one axis to -1")
    return sizes


def _divides(value: int, sizes: Mapping[str, int] | None, axes: tuple[str, ...], what: str,
             fix: str) -> None:
    """The one divisibility message: ``{what}={value} is not divisible by mesh.<axes> ...``."""
    sizes = sizes or {}
    n = math.prod(int(sizes.get(a, 1)) for a in axes)
    if value % n == 0:
        return
    if len(axes) == 1:
        shown = f"mesh.{axes[0]}={n}"
    else:
        shown = (f"{'*'.join('mesh.' + a for a in axes)} = "
                 f"{'*'.join(str(int(sizes.get(a, 1))) for a in axes)} = {n}")
    raise ConfigError(f"{what}={value} is not divisible by {shown}; {fix}")


def check_batch(batch: int, sizes: Mapping[str, int] | None, what: str = "batch_size",
                fix: str | None = None) -> None:
    """Raise :class:`ConfigError` unless ``batch`` splits over ``data * fsdp``.

    ``sizes``: the resolved axis sizes (:func:`resolve_mesh_shape`) or a mesh's ``shape``
    (None = one device). ``fix`` replaces the default advice in the message.
    """
    _divides(batch, sizes, BATCH_AXES, what,
             fix or "use a batch that is a multiple of it, or shrink mesh.data / mesh.fsdp "
                    "(e.g. move the devices to mesh.context to split one video)")


def check_tensor_split(value: int, sizes: Mapping[str, int] | None, what: str) -> None:
    """Raise :class:`ConfigError` unless ``value`` (heads, MLP width) splits over ``tensor``."""
    _divides(value, sizes, (HEADS_AXIS,), what, f"pick a mesh.tensor that divides {value}")


def mesh_config(mesh: Mesh | None) -> MeshConfig:
    """The :class:`MeshConfig` describing an existing mesh (the default config without one)."""
    if mesh is None:
        return MeshConfig()
    return MeshConfig(**{a: int(mesh.shape[a]) for a in MESH_AXES})


def check_mesh_axes(mesh: Mesh | None) -> None:
    """Raise :class:`ConfigError` unless ``mesh`` is None or a ``jax.sharding.Mesh`` with the
    axes ditax shards over."""
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ConfigError(f"mesh={mesh!r} is not a jax.sharding.Mesh ({type(mesh).__name__}); "
                          f"build one with ditax.make_mesh(...) or pass mesh=None")
    if mesh is not None and tuple(mesh.axis_names) != MESH_AXES:
        raise ConfigError(f"mesh axes {tuple(mesh.axis_names)} must be {MESH_AXES}; build it "
                          f"with ditax.make_mesh")


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
