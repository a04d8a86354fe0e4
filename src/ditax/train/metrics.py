"""Training metrics: one JSON line per step, TensorBoard scalars, an MFU estimate.

Only process 0 writes. MFU = achieved model FLOPs / (devices × peak FLOPs per device); the
peak comes from ``DITAX_PEAK_TFLOPS`` (per device, in the compute dtype) or from a small table
of accelerators; where it is unknown (CPU) ``mfu`` is null and ``tflops_per_device`` is
still reported.
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import jax

# dense bf16 peak TFLOP/s per device (vendor figures)
PEAK_TFLOPS = {"h100": 989.0, "h200": 989.0, "gh200": 989.0, "a100": 312.0, "l40s": 362.0,
               "b200": 2250.0, "tpu v4": 275.0, "tpu v5 lite": 197.0, "tpu v5e": 197.0,
               "tpu v5p": 459.0, "tpu v6": 918.0, "tpu7x": 2307.0}


def peak_tflops(device=None) -> float | None:
    """Per-device peak TFLOP/s, or None when unknown."""
    env = os.environ.get("DITAX_PEAK_TFLOPS")
    if env:
        return float(env)
    device = device or jax.devices()[0]
    kind = getattr(device, "device_kind", "").lower()
    for name, v in PEAK_TFLOPS.items():
        if name in kind:
            return v
    return None


class MetricsWriter:
    """Appends ``{"step", "loss", ...}`` lines to ``metrics.jsonl`` and scalars to TensorBoard."""

    def __init__(self, output_dir, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.path = pathlib.Path(output_dir) / "metrics.jsonl"
        self._f = None
        self._tb = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a")
            if tensorboard:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(str(pathlib.Path(output_dir) / "tb"))

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) and k != "loss"
                     else v) for k, v in row.items()}
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and v is not None:
                    self._tb.add_scalar(f"train/{k}", v, row["step"])

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        if self._tb is not None:
            self._tb.close()
