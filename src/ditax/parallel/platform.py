"""The target platform: which kind of accelerator ditax builds its program for.

Every platform decision (which attention kernels may run, Pallas compiled or interpreted,
what ``backend="auto"`` picks) asks :func:`platform_of`, never ``jax.default_backend()``:

1. inside ``with ditax.target_platform("cuda", compute_capability=(9, 0)):`` (or ``"tpu"``)
   that platform, whatever devices this process sees — so a CPU machine can lower the real
   CUDA or TPU program (``jax.jit(f).trace(...).lower(lowering_platforms=...)``, or a
   deviceless TPU topology mesh);
2. otherwise the platform of the mesh's devices (a TPU topology mesh is TPU);
3. without a mesh, the platform of ``jax.devices()``.

Platform names: ``cpu``, ``cuda`` (NVIDIA), ``rocm`` (AMD), ``tpu``. jax calls both GPU kinds
``"gpu"``; :func:`device_platform` tells them apart.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import jax

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
GPU_PLATFORMS = ("cuda", "rocm")
_ALIASES = {"gpu": "cuda", "nvidia": "cuda"}


@dataclass(frozen=True)
class Platform:
    """A target platform: ``name`` (one of :data:`PLATFORMS`) and, on CUDA, the compute
    capability ``(major, minor)`` when known. ``source`` says where the answer came from
    (for messages); it does not take part in equality."""

    name: str
    compute_capability: tuple[int, int] | None = None
    source: str = field(default="jax.devices()", compare=False)
    # jax's device_kind ("TPU v5 lite", ...) when known: what per-generation tables
    # (ditax.attention.tuning) read; "" for a platform named without devices
    device_kind: str = field(default="", compare=False)

    @property
    def is_gpu(self) -> bool:
        return self.name in GPU_PLATFORMS

    def describe(self) -> str:
        """Where the platform came from, in words: ``"jax.devices() are cpu"``."""
        if self.source == "target_platform":
            return f"ditax.target_platform is {self.name!r}"
        if self.source == "mesh":
            return f"the mesh's devices are {self.name}"
        return f"jax.devices() are {self.name}"


_TARGET: contextvars.ContextVar[Platform | None] = contextvars.ContextVar(
    "ditax_target_platform", default=None)


def _normalise(name: str) -> str:
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key not in PLATFORMS:
        raise ValueError(f"unknown target platform {name!r}; choose one of "
                         f"{', '.join(PLATFORMS)} (or 'gpu' for cuda)")
    return key


def _capability(cc) -> tuple[int, int] | None:
    if cc is None or cc == "":
        return None
    if isinstance(cc, str):
        cc = cc.split(".")[:2]
    major, minor = (int(x) for x in tuple(cc)[:2])
    return major, minor


@contextlib.contextmanager
def target_platform(name: str, compute_capability=None, device_kind: str = ""):
    """Build for ``name`` (``cpu`` | ``cuda`` | ``rocm`` | ``tpu``) inside the ``with`` block.

    ``compute_capability``: CUDA only, ``(major, minor)`` or ``"9.0"`` (e.g. H100/H200 =
    (9, 0)); it decides kernel limits such as cuDNN's head-dim limit. ``device_kind``: the
    chip as jax names it (e.g. ``"TPU v5 lite"``), for per-generation kernel tables. Nested
    blocks override the outer one and restore it on exit. Yields the :class:`Platform`.
    """
    plat = Platform(_normalise(name), _capability(compute_capability), "target_platform",
                    str(device_kind or ""))
    if plat.compute_capability is not None and plat.name != "cuda":
        raise ValueError(f"compute_capability={compute_capability!r} applies to cuda, not "
                         f"{plat.name!r}; drop it or use target_platform('cuda', ...)")
    token = _TARGET.set(plat)
    try:
        yield plat
    finally:
        _TARGET.reset(token)


def device_platform(device, source: str = "jax.devices()") -> Platform:
    """The :class:`Platform` of one jax device (or deviceless topology device)."""
    kind = str(getattr(device, "platform", "cpu")).lower()
    if kind == "gpu":
        # ROCm GPUs report platform "gpu" too; their client says rocm in its version string.
        client = getattr(device, "client", None)
        version = str(getattr(client, "platform_version", "")).lower()
        kind = "rocm" if "rocm" in version else "cuda"
    if kind not in PLATFORMS:
        kind = _ALIASES.get(kind, kind)
    cc = _capability(getattr(device, "compute_capability", None)) if kind == "cuda" else None
    return Platform(kind, cc, source, str(getattr(device, "device_kind", "") or ""))


def platform_of(mesh=None) -> Platform:
    """The platform ditax builds for: the :func:`target_platform` override, else the mesh's
    devices, else ``jax.devices()`` (CPU when no backend can start)."""
    target = _TARGET.get()
    if target is not None:
        return target
    if mesh is not None:
        return device_platform(mesh.devices.flat[0], "mesh")
    try:
        devices = jax.devices()
    except RuntimeError:  # no backend initialised at all
        return Platform("cpu")
    return device_platform(devices[0])


__all__ = ["Platform", "PLATFORMS", "GPU_PLATFORMS", "target_platform", "platform_of",
           "device_platform"]
