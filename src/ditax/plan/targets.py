"""The hardware ``ditax plan --target`` plans for: TPU chips and slice topologies, or N CPUs.

A TPU target compiles deviceless: ``jax.experimental.topologies`` describes the slice's
devices from libtpu alone (no TPU attached), and a mesh over those devices makes
``jax.jit(...).lower(...).compile()`` produce the real TPU executable. Target names follow
Cloud TPU accelerator types (``v5p-8`` counts TensorCores: 4 chips; ``v5e-8`` / ``v6e-8``
count chips; ``v7x-8`` counts TensorCores: 4 TPU7x chips). Chip figures are the vendor's
published per-chip numbers (sources beside each), divided by the JAX devices a chip shows:
a v5p chip is one device (its two TensorCores run as one "megacore"), a TPU7x (Ironwood) chip
is two (libtpu's ``tpu7x`` topologies give one device per TensorCore), so a v7x "chip" in a
plan is half a physical chip: 96 GiB of its 192, half its FLOP/s and bandwidths. libtpu
(0.0.42) names TPU7x slices ``tpu7x:AxBxC``; it refuses ``v7x:...`` ("Invalid TPU external name").

Single-chip targets (``tpu-v5e-1``, ``tpu-v6e-1``, ``tpu-v5p-1``, ``tpu-v7x-2``) need libtpu told
that a host holds one chip (``chips_per_host_bounds=(1, 1, 1)``); its default is a 2x2 host.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from typing import Optional

from ditax.errors import RequestError


@dataclass(frozen=True)
class Chip:
    """Per-chip (= per JAX device) peak figures for the roofline."""

    name: str
    bf16_flops: float      # peak dense bf16 FLOP/s
    hbm_bytes: float       # HBM capacity, bytes
    hbm_bandwidth: float   # bytes/s
    ici_bandwidth: float   # bidirectional inter-chip interconnect, bytes/s per chip
    source: str
    #: the bytes a program may hold on one device as the runtime reports them
    #: (``memory_stats()["bytes_limit"]``, which XLA enforces: "exceeds available HBM
    #: (15.75G)"), where measured on a chip; None: the published ``hbm_bytes``
    bytes_limit: Optional[float] = None

    @property
    def limit_bytes(self) -> float:
        """What "fits" is judged against: the measured :attr:`bytes_limit`, else the
        published HBM capacity."""
        return float(self.bytes_limit or self.hbm_bytes)


CHIPS = {
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOPs bf16, 16 GB HBM2 at 819 GBps,
    # ICI 1,600 Gbps (400 GBps bidirectional) per chip.
    # bytes_limit: memory_stats() on a v5e chip (JAX 0.10.2): 16,909,336,064 B = 15.75 GiB
    "v5e": Chip("TPU v5e", 197e12, 16e9, 819e9, 400e9, "https://cloud.google.com/tpu/docs/v5e",
                bytes_limit=16_909_336_064),
    # https://cloud.google.com/tpu/docs/v5p: 459 TFLOPs bf16, 95 GB HBM2e at 2,765 GBps,
    # ICI 4,800 Gbps (1,200 GBps bidirectional) per chip; 2 TensorCores = one JAX device.
    "v5p": Chip("TPU v5p", 459e12, 95e9, 2765e9, 1200e9, "https://cloud.google.com/tpu/docs/v5p"),
    # https://cloud.google.com/tpu/docs/v6e: 918 TFLOPs bf16, 32 GB HBM at 1,640 GBps,
    # ICI 800 GBps bidirectional per chip.
    "v6e": Chip("TPU v6e (Trillium)", 918e12, 32e9, 1640e9, 800e9,
                "https://cloud.google.com/tpu/docs/v6e"),
    # https://cloud.google.com/tpu/docs/tpu7x: 2,307 TFLOPs bf16 and 192 GiB HBM per chip, two
    # TensorCores per chip;
    # https://blog.google/products/google-cloud/ironwood-tpu-age-of-inference/: 7.37 TB/s HBM
    # and 1.2 TBps bidirectional ICI per chip. Per JAX device (one TensorCore): half of each
    # (traffic between a chip's two devices takes the die-to-die link, not ICI: halving ICI is
    # the conservative split).
    "v7x": Chip("TPU7x (Ironwood), one TensorCore", 2307e12 / 2, 192 * 2**30 / 2, 7.37e12 / 2,
                1.2e12 / 2, "https://cloud.google.com/tpu/docs/tpu7x"),
}

#: ``--target`` name → (chip, libtpu topology name). Slice shapes from the pages above.
TOPOLOGIES = {
    "tpu-v5e-1": ("v5e", "v5e:1x1"), "tpu-v6e-1": ("v6e", "v6e:1x1"),
    "tpu-v5p-1": ("v5p", "v5p:1x1x1"), "tpu-v7x-2": ("v7x", "tpu7x:1x1x1"),
    "tpu-v5e-4": ("v5e", "v5e:2x2"), "tpu-v5e-8": ("v5e", "v5e:2x4"),
    "tpu-v5e-16": ("v5e", "v5e:4x4"), "tpu-v5e-32": ("v5e", "v5e:4x8"),
    "tpu-v5p-8": ("v5p", "v5p:2x2x1"), "tpu-v5p-16": ("v5p", "v5p:2x2x2"),
    "tpu-v5p-32": ("v5p", "v5p:2x2x4"), "tpu-v5p-64": ("v5p", "v5p:2x4x4"),
    "tpu-v6e-4": ("v6e", "v6e:2x2"), "tpu-v6e-8": ("v6e", "v6e:2x4"),
    "tpu-v6e-16": ("v6e", "v6e:4x4"), "tpu-v6e-32": ("v6e", "v6e:4x8"),
    "tpu-v7x-8": ("v7x", "tpu7x:2x2x1"), "tpu-v7x-16": ("v7x", "tpu7x:2x2x2"),
}

#: Targets of one chip: libtpu's default host is 2x2 chips, which a 1x1 slice does not divide.
SINGLE_CHIP = frozenset({"tpu-v5e-1", "tpu-v6e-1", "tpu-v5p-1", "tpu-v7x-2"})


@dataclass(frozen=True)
class Target:
    """What to plan for: ``kind`` "tpu" (``chip``, ``topology``) or "cpu" (``num_devices``)."""

    name: str
    kind: str
    num_devices: Optional[int] = None
    chip: Optional[Chip] = None
    topology: Optional[str] = None
    chips_per_host: Optional[tuple] = None   # libtpu's chips_per_host_bounds, where not default


def parse_target(text: str) -> Target:
    """``tpu-v6e-8`` (see :data:`TOPOLOGIES`) or ``cpu:N``; :class:`RequestError` otherwise."""
    t = str(text).strip().lower()
    if t.startswith("cpu:") or t == "cpu":
        try:
            n = int(t.split(":", 1)[1]) if ":" in t else 1
        except ValueError:
            n = 0
        if n < 1:
            raise RequestError(f"--target {text!r}: cpu:N needs a device count N >= 1 "
                               f"(e.g. cpu:8)")
        return Target(t, "cpu", num_devices=n)
    if t in TOPOLOGIES:
        chip, topo = TOPOLOGIES[t]
        return Target(t, "tpu", chip=CHIPS[chip], topology=topo,
                      chips_per_host=(1, 1, 1) if t in SINGLE_CHIP else None)
    raise RequestError(f"unknown --target {text!r}; choose one of {', '.join(TOPOLOGIES)} "
                       f"or cpu:N")


def tpu_install_hint() -> str:
    """The pip command that installs libtpu matching the installed jax."""
    try:
        version = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - jax is a dependency
        version = "<your jax version>"
    return f'pip install "jax[tpu]=={version}"'


def has_libtpu() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def topology_devices(target: Target) -> list:
    """The deviceless devices of a TPU target's slice (needs libtpu; no TPU attached).

    Sets, when unset, ``TPU_SKIP_MDS_QUERY=1`` (off a TPU VM there is no metadata server to
    ask) and ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` (libtpu's lockfile guards a TPU, and a compile
    that drives none need not wait for another process holding it).
    """
    if not has_libtpu():
        raise RequestError(f"--target {target.name} compiles for TPU without a TPU and needs "
                           f"libtpu, which is not installed: {tpu_install_hint()}")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    bounds = {} if target.chips_per_host is None else {"chips_per_host_bounds":
                                                        target.chips_per_host}
    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=target.topology,
                                            **bounds)
    except Exception as e:  # libtpu's own error (e.g. a version that lacks this chip)
        raise RequestError(f"--target {target.name}: libtpu cannot describe topology "
                           f"{target.topology!r} ({str(e).splitlines()[0]}); check that libtpu "
                           f"matches jax: {tpu_install_hint()}") from None
    return list(topo.devices)


__all__ = ["Chip", "CHIPS", "TOPOLOGIES", "Target", "parse_target", "topology_devices",
           "has_libtpu", "tpu_install_hint"]
