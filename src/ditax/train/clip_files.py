"""The files of a folder of clips (``ditax preprocess``, ``ditax train-vae``): the media
extensions, and the sidecar files of a clip, ``NAME.KIND.EXT`` beside ``NAME.mp4`` (or an image):
``NAME.control.mp4`` / ``NAME.mask.mp4`` (videos) and ``NAME.ref.png``, ``NAME.ref2.png``...
(images) — the control inputs a family's encoders take (VACE), not samples themselves.
:func:`sidecar_problems` is the cheap check of them before any encoding (reference counts,
binary masks)."""

from __future__ import annotations

import glob
import pathlib
import re

VIDEO_EXT = (".mp4", ".mov", ".webm", ".mkv", ".avi")
IMAGE_EXT = (".png", ".jpg", ".jpeg", ".webp", ".bmp")   # a still image: one frame
SIDECAR_VIDEOS = ("control", "mask")
SIDECAR_IMAGE = re.compile(r"ref\d*")


def sidecar_kind(path) -> str | None:
    """``"control"``, ``"mask"`` or ``"references"`` for a sidecar file name, else None."""
    p = pathlib.Path(path)
    kind = pathlib.Path(p.stem).suffix[1:]
    if kind in SIDECAR_VIDEOS and p.suffix.lower() in VIDEO_EXT:
        return kind
    if SIDECAR_IMAGE.fullmatch(kind) and p.suffix.lower() in IMAGE_EXT:
        return "references"
    return None


def clip_sidecars(path) -> dict:
    """The sidecar files of the clip at ``path``: ``{"control": p, "mask": p, "references":
    [p, ...]}`` (those present; references in name order: ``NAME.ref.png``, ``NAME.ref2.png``)."""
    path = pathlib.Path(path)
    out: dict = {}
    for p in sorted(path.parent.glob(f"{glob.escape(path.stem)}.*.*")):
        kind = sidecar_kind(p)
        if kind is None or pathlib.Path(p.stem).stem != path.stem:
            continue
        if kind == "references":
            out.setdefault(kind, []).append(p)
        else:
            out[kind] = p
    return out


def check_sidecars(folder, stems) -> None:
    """Every sidecar-named file of ``folder`` belongs to a clip (one of ``stems``): a
    :class:`~ditax.errors.RequestError` naming the first that does not (never dropped unseen)."""
    from ditax.errors import RequestError

    for p in sorted(pathlib.Path(folder).iterdir()):
        if sidecar_kind(p) is not None and pathlib.Path(p.stem).stem not in stems:
            raise RequestError(f"{p.name} is named as a sidecar of a clip "
                               f"{pathlib.Path(p.stem).stem}.* (control / mask / reference "
                               f"input) but there is no such clip; add the clip or rename the "
                               f"file (a sample's name has no .control / .mask / .ref part)")


def sidecar_problems(clips, frames: int | dict | None = None, masked=None) -> list[str]:
    """The problems of the sidecars of ``clips`` (clip paths), each naming its file, found
    before any encoding: clips whose number of reference images differs from the most common
    number (every clip of a dataset needs the same: they are latent frames of its sample), and
    mask videos with a frame (of the first ``frames``; None: all; a dict: each clip's own
    count by path, as a bucketed run reads them) that is not binary — a pixel farther than
    VACE's snap (0.1) from black or white, or with differing R, G, B. The mask is checked as
    the file holds it: resized nearest-neighbour (``ditax preprocess``) a binary mask stays
    binary. ``masked``: the clips whose masks are read (None: all of ``clips``; one process
    of several reads its own part's, the reference counts being compared over all)."""
    import collections

    found = {pathlib.Path(c): clip_sidecars(c) for c in clips}
    masked = None if masked is None else {pathlib.Path(c) for c in masked}
    problems = []
    refs = {c: s.get("references", []) for c, s in found.items()}
    counts = collections.Counter(len(r) for r in refs.values())
    if len(counts) > 1:
        usual = counts.most_common(1)[0][0]
        names = [p.name for r in refs.values() if len(r) == usual for p in r]
        shown = f" ({', '.join(names[:4])}{', …' if len(names) > 4 else ''})" if names else ""
        for c, r in refs.items():
            if len(r) != usual:
                own = f" ({', '.join(p.name for p in r)})" if r else ""
                problems.append(f"{c.name} has {len(r)} reference image(s){own} where "
                                f"{counts[usual]} other clip(s) have {usual}{shown}; every "
                                f"clip needs the same number of NAME.ref*.png")
    for c, s in found.items():
        if "mask" in s and (masked is None or c in masked):
            own = frames.get(c) if isinstance(frames, dict) else frames
            bad = _mask_problem(s["mask"], own)
            if bad:
                problems.append(f"{s['mask'].name}: {bad}")
    return problems


def _mask_problem(path, frames: int | None) -> str | None:
    """What is wrong with mask video ``path`` (unreadable, fewer than ``frames`` frames, its
    first non-binary frame), else None."""
    import imageio_ffmpeg
    import numpy as np

    from ditax.io.files import ffmpeg_problem
    from ditax.io.video import _ffmpeg_subprocess
    from ditax.io.images import MASK_SNAP as SNAP     # the rule the encoders apply

    n = 0
    try:
        with _ffmpeg_subprocess():
            gen = imageio_ffmpeg.read_frames(str(path))
            try:
                w, h = next(gen)["size"]
                for n, raw in enumerate(gen, 1):
                    x = np.frombuffer(raw, np.uint8).reshape(h, w, 3).astype(np.float32) / 255
                    spread = np.abs(x - x[..., :1]).max(axis=-1)
                    off = np.abs(x[..., 0] - np.round(x[..., 0]))
                    at = f"frame {n - 1} (from 0)"
                    if spread.max() > SNAP:
                        y, xx = np.unravel_index(int(spread.argmax()), spread.shape)
                        return (f"{at} has differing R, G, B at y={y}, x={xx}; a mask is grey: "
                                f"white = generate, black = keep")
                    if off.max() > SNAP:
                        y, xx = np.unravel_index(int(off.argmax()), off.shape)
                        return (f"{at} is not binary (a value {x[y, xx, 0]:.3g} at y={y}, "
                                f"x={xx}); white = generate, black = keep — threshold it "
                                f"(mask > 0.5)")
                    if n == frames:
                        break
            finally:
                gen.close()
    except (OSError, RuntimeError, StopIteration, ValueError) as e:
        return f"cannot be read as a video ({ffmpeg_problem(e)})"
    if frames is not None and n < frames:
        return f"has {n} frames, fewer than --frames={frames}; a mask needs one per clip frame"
    return None


__all__ = ["IMAGE_EXT", "VIDEO_EXT", "check_sidecars", "clip_sidecars", "sidecar_kind",
           "sidecar_problems"]
