"""Joining a group of ``ditax serve`` processes (:mod:`ditax.serve.group`): whether a mesh asks
for one (:func:`is_group`), its multi-process keys checked before anything starts
(:func:`check_mesh`), jax's distributed runtime started (:func:`start`), and the settings every
process must share (:func:`fingerprint`, compared by :meth:`~ditax.serve.group.Group.agree`).
"""

from __future__ import annotations

import pathlib

from ditax.errors import ConfigError
from ditax.serve.group import TIMEOUT, Group
from ditax.serve.model_hash import folder_hash

SMALL_FILE = 1 << 16          # files up to this size count by their content (configs)


def is_group(mesh) -> bool:
    """Whether ``mesh`` (a :class:`~ditax.parallel.mesh.MeshConfig`) asks for several
    processes (``mesh.num_processes`` > 1, or a coordinator named)."""
    return ((mesh.num_processes or 1) > 1 or mesh.coordinator_address is not None
            or mesh.process_id is not None)


def check_mesh(mesh) -> None:
    """The multi-process keys of ``mesh``, checked before anything starts (one
    :class:`ConfigError` line each)."""
    n, k, address = mesh.num_processes, mesh.process_id, mesh.coordinator_address
    example = "mesh.num_processes=2 mesh.process_id=0 mesh.coordinator_address=HOST:PORT"
    if n is not None and n < 1:
        raise ConfigError(f"mesh.num_processes={n} must be >= 1 (the processes serving the "
                          f"model), e.g. {example}")
    if n is None:
        given = (f"mesh.coordinator_address={address}" if address is not None else
                 f"mesh.process_id={k}")
        raise ConfigError(f"{given} needs mesh.num_processes=N (the processes serving the "
                          f"model, >= 1), e.g. {example}")
    if address is None:
        raise ConfigError(f"mesh.num_processes={n} needs mesh.coordinator_address=HOST:PORT: "
                          f"process 0's address and a free port, the same on every process, "
                          f"e.g. {example}")
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"mesh.coordinator_address={address} is not HOST:PORT (process 0's "
                          f"address and a free port), e.g. mesh.coordinator_address="
                          f"10.0.0.1:4567")
    if k is None:
        raise ConfigError(f"mesh.num_processes={n} needs mesh.process_id=K on each process: 0 "
                          f"for the leader (it serves HTTP), 1 to {n - 1} for the others")
    if not 0 <= k < n:
        raise ConfigError(f"mesh.process_id={k} is out of range: with mesh.num_processes={n} "
                          f"it is 0 (the leader) to {n - 1}")


def start(mesh, timeout: float = TIMEOUT) -> "Group":
    """Join the group of ``mesh`` (checked by :func:`check_mesh`): jax's distributed runtime
    (gloo collectives on CPU; jax's heartbeat timeout three times ``timeout``), before any jax
    computation. Blocks until every process has joined (jax's initialization timeout, 300 s)."""
    import jax

    # a CPU group's collectives; chosen before initialize, ignored by GPU / TPU clients
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(mesh.coordinator_address, num_processes=mesh.num_processes,
                               process_id=mesh.process_id,
                               heartbeat_timeout_seconds=max(10, int(3 * timeout)))
    return Group(mesh.process_id, mesh.num_processes, timeout)


def fingerprint(root, overrides: list[str], loras: list[tuple[str, str]], **more) -> dict:
    """What every process of a group must share: the model folder's files (relative paths,
    sizes and the content of the small ones: another host's copy of the same folder has the
    same fingerprint), the overrides but the process's own keys, the LoRAs (names, sizes) and
    ``more`` (``max_batch``, ``batching``: the followers adopt the leader's)."""
    own = ("mesh.process_id=", "mesh.coordinator_address=")
    return {"model": folder_hash(root, SMALL_FILE, times=False),
            "overrides": [o for o in overrides if not o.startswith(own)],
            "loras": [[name, pathlib.Path(f).stat().st_size] for name, f in loras], **more}


__all__ = ["check_mesh", "fingerprint", "is_group", "start"]
