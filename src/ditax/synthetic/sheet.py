"""Contact sheet: one row per video (frames sampled evenly), its prompt as the row's label.

Layout (all in pixels, ``s = scale``): each row is a label band of ``LABEL_HEIGHT`` above
``frames`` frames of ``W*s × H*s`` separated by ``PAD``; rows are stacked with ``PAD`` around
everything, on a mid-grey canvas so that dark frames stay visible. Hence

    width  = PAD + frames * (W*s + PAD)          (of the widest row)
    height = PAD + sum over rows of (LABEL_HEIGHT + H*s + PAD)

(:func:`sheet_size` computes it.) Frames are enlarged with nearest-neighbour so pixels stay
sharp; labels use Pillow's default font.
"""

from __future__ import annotations

import pathlib

import numpy as np

PAD = 4
LABEL_HEIGHT = 18
BACKGROUND = (96, 96, 96)
TEXT = (255, 255, 255)


def sample_frames(video, frames: int) -> np.ndarray:
    """``frames`` evenly spaced frames of ``video`` (first and last included), uint8."""
    from ditax.io.video import to_uint8

    v = to_uint8(video)
    idx = np.round(np.linspace(0, len(v) - 1, min(frames, len(v)))).astype(int)
    return v[idx]


def sheet_size(shapes, frames: int = 8, scale: int = 2) -> tuple[int, int]:
    """(width, height) of the sheet for videos of ``shapes`` (each ``(F, H, W, 3)``)."""
    rows = [(min(frames, f), h, w) for f, h, w, _ in shapes]
    width = max(PAD + n * (w * scale + PAD) for n, _, w in rows)
    height = PAD + sum(LABEL_HEIGHT + h * scale + PAD for _, h, _ in rows)
    return width, height


def contact_sheet(videos, prompts, path, *, frames: int = 8, scale: int = 2,
                  stage=None) -> pathlib.Path:
    """Write a PNG with one row per ``(video, prompt)`` and return its path.

    ``videos``: sequence of ``[F, H, W, 3]`` (float in [0, 1] or uint8); ``prompts``: one
    label each; ``frames``: frames shown per row; ``scale``: integer enlargement. Written
    whole (:func:`~ditax.io.outputs.atomic_file`; renamed with the other outputs of
    ``stage``, a :class:`~ditax.io.outputs.Staging`, when given): a failed write is
    :class:`~ditax.io.outputs.WriteFailed` naming ``path``, and a sheet that was there stays.
    """
    from PIL import Image, ImageDraw, ImageFont

    from ditax.io.outputs import atomic_file

    videos = list(videos)
    prompts = [str(p) for p in prompts]
    if len(videos) != len(prompts) or not videos:
        raise ValueError(f"need one prompt per video and at least one video; got "
                         f"{len(videos)} videos, {len(prompts)} prompts")
    rows = [sample_frames(v, frames) for v in videos]
    size = sheet_size([r.shape for r in rows], frames, scale)
    canvas = Image.new("RGB", size, BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=LABEL_HEIGHT - 5)
    y = PAD
    for row, label in zip(rows, prompts):
        draw.text((PAD, y + 1), label, fill=TEXT, font=font)
        y += LABEL_HEIGHT
        h, w = row.shape[1] * scale, row.shape[2] * scale
        for j, f in enumerate(row):
            img = Image.fromarray(f).resize((w, h), Image.NEAREST)
            canvas.paste(img, (PAD + j * (w + PAD), y))
        y += h + PAD
    path = pathlib.Path(path)
    with atomic_file(path, stage) as tmp:     # its suffix is path's: the format PIL picks
        canvas.save(tmp)
    return path


__all__ = ["contact_sheet", "sheet_size", "sample_frames"]
