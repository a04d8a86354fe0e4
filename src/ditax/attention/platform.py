"""Small platform probes for the attention backends: which accelerator is visible, which
optional libraries import. Each probe is cheap and has no side effects (no config updates,
no device allocation beyond listing devices)."""

from __future__ import annotations

import functools
import importlib.util

import jax


def device_platforms() -> tuple[str, ...]:
    """Sorted platforms of ``jax.devices()`` (e.g. ``("cpu",)``, ``("gpu",)``)."""
    try:
        return tuple(sorted({d.platform for d in jax.devices()}))
    except RuntimeError:  # no backend initialised at all
        return ()


def has_cuda_gpu() -> bool:
    """True when JAX sees at least one NVIDIA GPU (cuda platform)."""
    try:
        devs = jax.devices()
    except RuntimeError:
        return False
    for d in devs:
        if d.platform != "gpu":
            continue
        # ROCm GPUs report platform "gpu" too; their client says rocm in its version string.
        version = str(getattr(getattr(d, "client", None), "platform_version", "")).lower()
        if "rocm" not in version:
            return True
    return False


def has_tpu() -> bool:
    return "tpu" in device_platforms()


def cuda_compute_capability() -> tuple[int, int] | None:
    """``(major, minor)`` of the first CUDA device, or None without one."""
    if not has_cuda_gpu():
        return None
    cc = getattr(jax.devices("gpu")[0], "compute_capability", None)
    if not cc:
        return None
    major, minor = (int(x) for x in str(cc).split(".")[:2])
    return major, minor


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


def no_cuda_reason() -> str:
    """The unmet condition, in words, for error messages."""
    plats = device_platforms()
    return f"no CUDA GPU visible: jax.devices() are {', '.join(plats) or 'none'}"
