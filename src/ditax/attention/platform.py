"""Small probes for the GPU attention backends: CUDA on the target platform, and optional
libraries that import. The platform itself comes from :func:`ditax.parallel.platform.platform_of`
(``ditax.target_platform(...)``, else the mesh's devices, else ``jax.devices()``). Each probe is
cheap and has no side effects (no config updates, no imports of the probed library)."""

from __future__ import annotations

import functools
import importlib.util

from ditax.parallel.platform import platform_of


def has_cuda_gpu(mesh=None) -> bool:
    """True when the target platform is an NVIDIA GPU (cuda)."""
    return platform_of(mesh).name == "cuda"


def cuda_compute_capability(mesh=None) -> tuple[int, int] | None:
    """``(major, minor)`` of the target CUDA platform, or None off CUDA / when unknown."""
    plat = platform_of(mesh)
    return plat.compute_capability if plat.name == "cuda" else None


@functools.lru_cache(maxsize=None)
def module_available(name: str) -> bool:
    """Importable without importing it (no import-time side effects)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def has_transformer_engine_jax() -> bool:
    """TransformerEngine with its JAX extension installed."""
    return module_available("transformer_engine") and module_available("transformer_engine.jax")


def no_cuda_reason(mesh=None) -> str:
    """The unmet condition, in words, for error messages."""
    return f"no CUDA GPU visible: {platform_of(mesh).describe()}"
