"""Deterministic synthetic clips: one bright filled object moving straight on a dark background.

A clip is drawn from a :class:`ClipSpec` (combination, size, start, travel, background) that is
sampled from a seeded numpy ``Generator``, so the same seed always gives the same array.
Frames are float32 ``[F, H, W, 3]`` in [0, 1]:

- background: one plain shade, every channel <= 0.2 (a dark grey with a slight tint);
- object: a filled circle or square of the vocabulary colour (exactly that RGB inside,
  anti-aliased by exact pixel coverage at the edge), always fully inside the frame;
- motion: constant speed along the direction's axis, the centre travels 30%–(as far as fits)
  of the frame's extent along that axis between the first and the last frame.

:func:`write_dataset` writes ``clip_00000.mp4 ...`` plus ``captions.jsonl`` (one row per clip
with ``file``, ``caption`` and the combination), the layout ``ditax preprocess`` reads. Every
file is written under a temporary name, by an ffmpeg whose exit status and error lines are read
(:mod:`ditax.io.ffmpeg`), and all are renamed together at the end
(:func:`ditax.io.outputs.staged`): a failed write (the disk full) is
:class:`~ditax.io.outputs.WriteFailed` naming the file, no file of the dataset is left under
its name and the files that were there stay as they were.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np

from ditax.errors import RequestError
from ditax.synthetic.vocab import (DIRECTION_VECTORS, Combo, all_combinations, check_combo,
                                   paraphrase, seen_combinations)

SIZE_RANGE = (0.18, 0.32)        # object diameter / side as a fraction of min(H, W)
MIN_TRAVEL = 0.30                # centre travel as a fraction of the frame along the motion axis
BACKGROUND_MAX = 0.2
MARGIN = 1.0                     # pixels kept free between the object and the frame edge


@dataclasses.dataclass(frozen=True)
class ClipSpec:
    """Everything that defines one clip; positions in pixels, pixel ``j`` spans ``[j, j+1)``."""

    combo: Combo
    size: float                                  # circle diameter / square side
    start: tuple[float, float]                   # object centre (y, x) in the first frame
    travel: float                                # centre displacement, first → last frame
    background: tuple[float, float, float]

    def centres(self, num_frames: int) -> np.ndarray:
        """Object centre per frame, ``[F, 2]`` (y, x)."""
        step = np.asarray(DIRECTION_VECTORS[self.combo.direction], np.float64)
        t = np.linspace(0.0, 1.0, num_frames)[:, None]
        return np.asarray(self.start, np.float64) + t * self.travel * step


def _check_size(height: int, width: int, num_frames: int) -> None:
    if min(height, width) < 16 or num_frames < 2:
        raise RequestError(f"clips need height, width >= 16 and num_frames >= 2; got "
                           f"{height}x{width}, {num_frames} frames")


def sample_spec(rng: np.random.Generator, combo, height: int, width: int) -> ClipSpec:
    """Random size, start, travel (hence speed) and background for ``combo``."""
    combo = check_combo(*combo)
    size = float(rng.uniform(*SIZE_RANGE) * min(height, width))
    axis = 0 if combo.direction in ("up", "down") else 1
    extent = (height, width)
    lo = [MARGIN + size / 2] * 2                          # allowed centre range per axis
    hi = [e - MARGIN - size / 2 for e in extent]
    room = hi[axis] - lo[axis]
    travel = float(rng.uniform(min(MIN_TRAVEL * extent[axis], room), room))
    sign = DIRECTION_VECTORS[combo.direction][axis]
    first = rng.uniform(lo[axis], hi[axis] - travel)      # lower end of the path
    start = [0.0, 0.0]
    start[axis] = first if sign > 0 else first + travel
    start[1 - axis] = rng.uniform(lo[1 - axis], hi[1 - axis])
    shade = rng.uniform(0.02, 0.16)
    tint = rng.uniform(-0.03, 0.03, size=3)
    bg = np.clip(shade + tint, 0.0, BACKGROUND_MAX)
    return ClipSpec(combo, size, (float(start[0]), float(start[1])), travel,
                    tuple(float(c) for c in bg))


def coverage(spec: ClipSpec, height: int, width: int, num_frames: int) -> np.ndarray:
    """Fraction of each pixel covered by the object, float32 ``[F, H, W]`` in [0, 1]."""
    c = spec.centres(num_frames)
    cy, cx = c[:, 0, None, None], c[:, 1, None, None]
    y = np.arange(height, dtype=np.float64)[None, :, None]
    x = np.arange(width, dtype=np.float64)[None, None, :]
    half = spec.size / 2
    if spec.combo.shape == "square":   # exact area of pixel ∩ square (axis-aligned)
        ov_y = np.clip(np.minimum(y + 1, cy + half) - np.maximum(y, cy - half), 0, 1)
        ov_x = np.clip(np.minimum(x + 1, cx + half) - np.maximum(x, cx - half), 0, 1)
        a = ov_y * ov_x
    else:                              # distance from the pixel centre to the rim, ±0.5 px ramp
        dist = np.sqrt((y + 0.5 - cy) ** 2 + (x + 0.5 - cx) ** 2)
        a = np.clip(half + 0.5 - dist, 0, 1)
    return a.astype(np.float32)


def render(spec: ClipSpec, height: int, width: int, num_frames: int) -> np.ndarray:
    """Frames of ``spec``: float32 ``[F, H, W, 3]`` in [0, 1]."""
    _check_size(height, width, num_frames)
    a = coverage(spec, height, width, num_frames)[..., None]
    rgb = np.asarray(spec.combo.rgb, np.float32)
    bg = np.asarray(spec.background, np.float32)
    # (1 - a) * bg + a * rgb is exactly rgb where a == 1 (the interior)
    return (1.0 - a) * bg + a * rgb


def make_clip(seed, combo=None, *, height: int = 64, width: int = 64, num_frames: int = 17,
              include_held_out: bool = False) -> tuple[np.ndarray, ClipSpec]:
    """One clip from ``seed`` (an int or a sequence of ints for ``np.random.default_rng``).

    ``combo`` (colour, shape, direction) fixes the combination; otherwise it is drawn from the
    seen combinations (all 40 with ``include_held_out``). Returns (video, spec).
    """
    _check_size(height, width, num_frames)
    rng = np.random.default_rng(seed)
    if combo is None:
        pool = all_combinations() if include_held_out else seen_combinations()
        combo = pool[int(rng.integers(len(pool)))]
    spec = sample_spec(rng, combo, height, width)
    return render(spec, height, width, num_frames), spec


def dataset_combos(n: int, seed: int, include_held_out: bool = False) -> list[Combo]:
    """``n`` combinations, balanced: each pass over the pool is a fresh shuffle of it."""
    pool = all_combinations() if include_held_out else seen_combinations()
    rng = np.random.default_rng([seed, 0x5EED])
    out: list[Combo] = []
    while len(out) < n:
        out += [pool[i] for i in rng.permutation(len(pool))]
    return out[:n]


def generate(n: int, seed: int, *, height: int = 64, width: int = 64, num_frames: int = 17,
             include_held_out: bool = False) -> Iterator[tuple[np.ndarray, ClipSpec]]:
    """``n`` clips (video, spec); clip ``i`` is ``make_clip((seed, i), dataset_combos(...)[i])``,
    so any one can be recreated alone."""
    for i, combo in enumerate(dataset_combos(n, seed, include_held_out)):
        yield make_clip((seed, i), combo, height=height, width=width, num_frames=num_frames)


def write_dataset(folder, n: int, seed: int, height: int = 64, width: int = 64,
                  num_frames: int = 17, include_held_out: bool = False, *,
                  paraphrase_fraction: float = 0.0, fps: int = 16,
                  workers: int = 4) -> pathlib.Path:
    """Write ``n`` clips as ``folder/clip_00000.mp4 ...`` and ``folder/captions.jsonl``.

    Captions are canonical; with ``paraphrase_fraction`` > 0 that share of clips (drawn from
    the seed) gets a paraphrase template instead. Each jsonl row also holds ``prompt`` (the
    canonical form), ``colour``, ``shape``, ``direction`` and ``seed``. The mp4s are lossless
    4:4:4 H.264 (:func:`write_clip`).
    Returns ``folder``.
    """
    from ditax.io.outputs import staged
    from ditax.io.video import _ffmpeg_subprocess

    folder = pathlib.Path(folder)
    cap_rng = np.random.default_rng([seed, 0xCA9])
    rows = []
    clips = generate(n, seed, height=height, width=width, num_frames=num_frames,
                     include_held_out=include_held_out)
    # each clip is encoded by its own ffmpeg process, while the next ones are drawn; the
    # pool ends (its ffmpegs done) before the staging removes what a failure left
    with staged() as stage, _ffmpeg_subprocess(), ThreadPoolExecutor(workers) as pool:
        pending = collections.deque()
        try:
            for i, (video, spec) in enumerate(clips):
                name = f"clip_{i:05d}.mp4"
                pending.append(pool.submit(_encode_clip, stage.file(folder / name), video,
                                           fps))
                while len(pending) > 2 * workers:
                    pending.popleft().result()
                para = cap_rng.random() < paraphrase_fraction
                k = int(cap_rng.integers(1 << 16))
                caption = paraphrase(spec.combo, k) if para else spec.combo.prompt
                rows.append({"file": name, "caption": caption, "prompt": spec.combo.prompt,
                             **spec.combo._asdict(), "seed": [seed, i]})
            while pending:
                pending.popleft().result()
        except BaseException:
            for f in pending:       # a clip failed: the ones not started are not encoded
                f.cancel()
            raise
        stage.file(folder / "captions.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
    return folder


def write_clip(path, video, fps: int = 16) -> pathlib.Path:
    """Lossless H.264 (``-crf 0``, yuv444p) mp4 of ``video`` ``[F, H, W, 3]``.

    Not :func:`ditax.io.video.write_mp4`: its yuv420p halves the chroma resolution, which on
    these small, saturated objects shifts colours by up to 12/255 within 3 pixels of every
    edge. yuv444p at crf 0 decodes within 2/255 of the uint8 frames everywhere (8-bit YUV
    rounding only). ffmpeg (hence ``ditax preprocess``) reads it; some browsers do not play
    4:4:4 H.264, which does not matter for training data.
    Written whole (:func:`~ditax.io.outputs.atomic_file`): a failed write is
    :class:`~ditax.io.outputs.WriteFailed` naming ``path``, and a file that was there stays.
    """
    from ditax.io.outputs import atomic_file

    path = pathlib.Path(path)
    with atomic_file(path) as tmp:
        _encode_clip(tmp, video, fps)
    return path


def _encode_clip(tmp: pathlib.Path, video, fps: int) -> None:
    """``video`` as a lossless 4:4:4 H.264 mp4 at ``tmp`` (a staged write's temporary path);
    ffmpeg's failure is :class:`~ditax.io.outputs.WriteFailed` naming ``tmp``."""
    from ditax.io.video import encode_mp4, to_uint8

    encode_mp4(tmp, to_uint8(video), fps, pix_fmt="yuv444p", crf=0)


__all__ = ["ClipSpec", "sample_spec", "coverage", "render", "make_clip", "dataset_combos",
           "generate", "write_dataset", "write_clip", "SIZE_RANGE", "MIN_TRAVEL",
           "BACKGROUND_MAX"]
