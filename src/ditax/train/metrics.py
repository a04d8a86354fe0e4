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
import sys

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


def summary_writer_class():
    """tensorboardX's ``SummaryWriter``, imported without torch.

    tensorboardX imports torch wherever it is installed (only to also accept torch tensors,
    which ditax never passes): 1.5-2 s of CPU at every ``ditax train`` start that uses
    nothing else of torch. Unless torch is already imported, ``sys.modules["torch"] = None``
    while tensorboardX imports makes its ``import torch`` raise ImportError (Python's
    documented way to block an import), which it handles by taking numpy arrays and numbers
    only; the entry is removed right after, so a later ``import torch`` works as always.
    """
    if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
        sys.modules["torch"] = None
        try:
            import tensorboardX  # noqa: F401
        finally:
            if "torch" in sys.modules and sys.modules["torch"] is None:
                del sys.modules["torch"]
    from tensorboardX import SummaryWriter

    return SummaryWriter


class MetricsWriter:
    """Appends ``{"step", "loss", ...}`` lines to ``metrics.jsonl`` and scalars to TensorBoard.

    A row of a bucketed dataset's step names its ``bucket``; its loss also goes to
    TensorBoard as ``train/loss_by_bucket/{bucket}`` (one curve a shape).

    ``resume_step``: the step the run (re)starts from. Rows of later steps, left by a run that
    stopped after its last checkpoint (kill -9, SIGTERM, a damaged checkpoint), are dropped
    first, as is a last line cut short by a kill, so every step is in the file once; the
    TensorBoard events are written anew from the rows kept (``tb/`` holds each step once).
    """

    def __init__(self, output_dir, enabled: bool = True, tensorboard: bool = True,
                 resume_step: int | None = None):
        self.enabled = enabled
        self.path = pathlib.Path(output_dir) / "metrics.jsonl"
        self.tb_dir = pathlib.Path(output_dir) / "tb"
        self.dropped = 0
        self._f = None
        self._tb = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = None
            if resume_step is not None:
                kept = self._truncate(resume_step)
            self._f = open(self.path, "a")
            if tensorboard:
                SummaryWriter = summary_writer_class()
                if kept is not None and self.tb_dir.is_dir():
                    for f in self.tb_dir.glob("events.out.tfevents.*"):
                        f.unlink()
                self._tb = SummaryWriter(str(self.tb_dir))
                for row in kept or ():
                    self._scalars(row)

    def _truncate(self, resume_step: int) -> list[dict]:
        """Drop rows after ``resume_step`` (and a cut last line); returns the rows kept."""
        if not self.path.is_file():
            return []
        lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        keep, rows = [], []
        for i, line in enumerate(lines):
            try:
                row = json.loads(line)
            except ValueError:
                if i == len(lines) - 1:         # cut short by a kill mid-write
                    self.dropped += 1
                else:                           # not ours to judge: kept as it is
                    keep.append(line)
                continue
            step = row.get("step") if isinstance(row, dict) else None
            if isinstance(step, int) and step > resume_step:
                self.dropped += 1
                continue
            keep.append(line)
            if isinstance(step, int):
                rows.append(row)
        if self.dropped:
            tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
            tmp.write_text("".join(f"{line}\n" for line in keep), encoding="utf-8")
            os.replace(tmp, self.path)
        return rows

    def _scalars(self, row: dict) -> None:
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                self._tb.add_scalar(f"train/{k}", v, row["step"])
        loss = row.get("loss")
        if isinstance(row.get("bucket"), str) and isinstance(loss, (int, float)):
            self._tb.add_scalar(f"train/loss_by_bucket/{row['bucket']}", loss, row["step"])

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) and k != "loss"
                     else v) for k, v in row.items()}
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()
        if self._tb is not None:
            self._scalars(row)

    def image(self, tag: str, pixels, step: int) -> None:
        """An ``[H, W, 3]`` uint8 image: TensorBoard (``tag``) and
        ``{output_dir}/samples/{name}_{step}.png``."""
        if not self.enabled:
            return
        import PIL.Image

        folder = self.path.parent / "samples"
        folder.mkdir(exist_ok=True)
        PIL.Image.fromarray(pixels).save(folder / f"{tag.rsplit('/', 1)[-1]}_{step:06d}.png")
        if self._tb is not None:
            self._tb.add_image(tag, pixels, step, dataformats="HWC")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        if self._tb is not None:
            self._tb.close()
