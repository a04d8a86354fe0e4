"""Which 8-bit dots a target runs natively, and the one mode refused where it does not.

An 8-bit x 8-bit dot pays only where the chip's matrix units take both operands in 8 bits, at
twice the bf16 rate: int8 on TPU v5e / v5p / v6e, fp8 on TPU7x and on NVIDIA Hopper and later
(:func:`native_dots`). Elsewhere the same numbers are computed in the compute dtype (CPU:
every mode, as the tests run them). fp8 activations on a TPU without fp8 matrix units (v5e,
v5p, v6e) are refused before any work (:func:`check_dots`): their dots would be slower than
bf16's, and int8 activations run natively there. The target is ``ditax.target_platform``'s
where one is set, else the mesh's devices (:func:`dots_target`), so a deviceless TPU topology
(``ditax plan --target tpu-v5e-1``) is judged as the chip it describes.
"""

from __future__ import annotations

import jax

from ditax.errors import ConfigError

# device kinds (lower case) whose matrix units take 8-bit operands at twice the bf16 rate
INT8_TPUS = ("tpu v5 lite", "tpu v5e", "tpu v5", "tpu v5p", "tpu v6 lite", "tpu v6e")
FP8_TPUS = ("tpu7x", "tpu v7")
FP8_GPUS = ("h100", "h200", "h800", "gh200", "b100", "b200", "gb200")


def native_dots(mode: str, activations: bool, platform: str, device_kind: str = "") -> bool:
    """Whether ``mode``'s dots run natively in 8 bits on ``platform`` (``jax.devices()[0]
    .platform``, or ditax's name: ``"cuda"``; ``device_kind`` e.g. ``"TPU v6 lite"``,
    ``"NVIDIA H200"``). Weights-only modes never do (the other operand is the compute
    dtype); int8 x int8 does on TPU v5e / v5p / v6e, fp8 x fp8 on TPU7x (v5e and v6e have
    no fp8 matrix unit) and on Hopper (H100 / H200) and later; CPU emulates every mode."""
    if not activations or mode == "none":
        return False
    kind = device_kind.lower()
    if platform == "tpu":
        return kind in (INT8_TPUS if mode == "int8" else FP8_TPUS)
    return (mode == "fp8" and platform in ("gpu", "cuda")
            and any(g in kind for g in FP8_GPUS))


def dots_target(devices=None) -> tuple[str, str]:
    """``(platform, device kind)`` a model's dots are built for: the platform of
    :func:`ditax.parallel.platform.platform_of` (``ditax.target_platform`` when set), else
    ``devices``' (default ``jax.devices()``); the kind is ``devices[0]``'s where it is of
    that platform (a deviceless TPU topology's: ``"TPU v5 lite"``), else ``""`` (unknown)."""
    from ditax.parallel.platform import device_platform, platform_of

    d = (devices or jax.devices())[0]
    own = device_platform(d)
    target = platform_of()
    name = target.name if target.source == "target_platform" else own.name
    return name, getattr(d, "device_kind", "") if own.name == name else ""


def check_dots(mode: str, activations: bool, devices=None) -> None:
    """Refuse fp8 activations on a TPU whose matrix units take no fp8 (every TPU before
    TPU7x): its fp8 x fp8 dots would run in bf16 after two conversions, slower than bf16,
    so they are never silently emulated there (a :class:`ConfigError` naming the chip and
    the two fixes). CPU (tests) and an unknown TPU kind emulate, as before."""
    if mode != "fp8" or not activations:
        return
    platform, kind = dots_target(devices)
    if platform != "tpu" or not kind or native_dots(mode, activations, platform, kind):
        return
    raise ConfigError(f"model.quantize=fp8 with model.quantize_activations=true: {kind} has "
                      f"no fp8 matrix unit (only TPU7x has), so fp8 x fp8 dots would run "
                      f"slower than bf16; use model.quantize=int8 (int8 x int8 dots are "
                      f"native on it) or fp8 weights only (model.quantize_activations=false)")


def describe(mode: str, activations: bool, devices=None) -> str:
    """One log phrase: the mode and whether its dots are native 8-bit on ``devices``."""
    if mode == "none":
        return "full precision"
    d = (devices or jax.devices())[0]
    native = native_dots(mode, activations, d.platform, getattr(d, "device_kind", ""))
    what = f"{mode} weights" + (f" x {mode} activations" if activations else "")
    how = ("native 8-bit dots" if native else
           "dots in the compute dtype (8-bit storage: memory only)" if not activations else
           "8-bit dots emulated (no native 8-bit matmul for this mode)")
    kind = getattr(d, "device_kind", "")
    where = d.platform if kind.lower() in ("", d.platform) else f"{d.platform} {kind}"
    return f"{what} on {where}: {how}"


__all__ = ["INT8_TPUS", "FP8_TPUS", "FP8_GPUS", "native_dots", "dots_target", "check_dots",
           "describe"]
