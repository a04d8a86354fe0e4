"""The files of a folder of clips (``ditax preprocess``, ``ditax train-vae``): the media
extensions, and the sidecar files of a clip, ``NAME.KIND.EXT`` beside ``NAME.mp4`` (or an image):
``NAME.control.mp4`` / ``NAME.mask.mp4`` (videos) and ``NAME.ref.png``, ``NAME.ref2.png``...
(images) — the control inputs a family's encoders take (VACE), not samples themselves."""

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


__all__ = ["IMAGE_EXT", "VIDEO_EXT", "check_sidecars", "clip_sidecars", "sidecar_kind"]
