"""Prompt following of a video, measured: the bright object's colour, shape and direction.

For every frame ``[H, W, 3]``:

1. the background is the per-channel median of the frame (the object covers well under half);
2. contrast ``d`` = largest per-channel distance from the background; pixels with
   ``d >= 0.5 * max(d)`` form the mask (half coverage of an anti-aliased edge), no object if
   ``max(d) < MIN_CONTRAST``;
3. the object is the largest connected part of the mask; it counts only if it is compact
   (bounding-box fill >= ``MIN_FILL``), holds most of the mask (one object, not clutter) and
   its area is between ``MIN_AREA`` pixels and ``MAX_AREA`` of the frame;
4. measured: centroid, mean colour of its core (``d >= 0.8 * max(d)``), and the fill of
   its bounding box from coverage (:func:`_soft_fill`: tolerant of blur).

Over the clip (needs an object in at least half of the frames): colour = vocabulary colour
nearest to the median core colour (none if farther than ``MAX_COLOUR_DISTANCE``); shape from
the median fill (circle ~ pi/4, square ~ 1, split at ``SQUARE_FILL``); direction from the mean
centroid of the last quarter of the found frames minus that of the first quarter, dominant
axis and sign (none if it moved less than ``MIN_MOTION`` of the frame). Random noise or an
empty video measures as "nothing", so every flag is False.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ditax.synthetic.vocab import COLOURS, parse_prompt

MIN_CONTRAST = 0.15        # peak distance from the background for a frame to hold an object
MIN_AREA = 6               # pixels
MAX_AREA = 0.5             # fraction of the frame
MIN_FILL = 0.6             # bounding-box fill below which a part is not a compact object
MIN_SHARE = 0.5            # the object holds at least this share of the mask's pixels
SQUARE_FILL = 0.86         # disc pi/4 ~ 0.79, square 1; blur lowers squares (corners) most
MAX_COLOUR_DISTANCE = 0.5  # RGB distance beyond which a colour is no vocabulary colour
MIN_MOTION = 0.05          # centroid travel, fraction of the frame, below which it is still
GROW = 3                   # pixels around the object's box summed for its area
EDGE = 2                   # pixels beside the object's box summed for its width / height


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What :func:`measure` saw; names are ``None`` where nothing could be told."""

    num_frames: int
    found_frames: int                               # frames with an object
    rgb: tuple[float, float, float] | None          # median core colour
    colour: str | None
    fill: float | None                              # median bounding-box fill
    shape: str | None
    displacement: tuple[float, float] | None        # (dy, dx) as fractions of (H, W)
    direction: str | None


def _as_float_video(video) -> np.ndarray:
    v = np.asarray(video)
    if v.ndim != 4 or v.shape[-1] != 3:
        raise ValueError(f"video must be [F, H, W, 3]; got shape {v.shape}")
    if v.dtype == np.uint8:
        return v.astype(np.float32) / 255.0
    return np.nan_to_num(v.astype(np.float32), nan=0.0)


def find_object(frame: np.ndarray) -> dict | None:
    """The bright object of one float frame ``[H, W, 3]``: ``{"centroid": (y, x), "rgb",
    "fill", "area"}``, or ``None`` when the frame holds no single compact object."""
    from scipy import ndimage

    h, w, _ = frame.shape
    bg = np.median(frame.reshape(-1, 3), axis=0)
    d = np.abs(frame - bg).max(axis=-1)                   # [H, W]
    peak = float(d.max())
    if peak < MIN_CONTRAST:
        return None
    mask = d >= 0.5 * peak
    labels, n = ndimage.label(mask)
    sizes = np.bincount(labels.ravel())[1:]
    k = int(np.argmax(sizes)) + 1
    area = int(sizes[k - 1])
    if area < MIN_AREA or area > MAX_AREA * h * w or area < MIN_SHARE * mask.sum():
        return None
    obj = labels == k
    ys, xs = np.nonzero(obj)
    fill = area / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    if fill < MIN_FILL:
        return None
    core = obj & (d >= 0.8 * peak)
    rgb = frame[core if core.any() else obj].mean(axis=0)
    return {"centroid": (float(ys.mean()), float(xs.mean())), "rgb": rgb, "area": area,
            "fill": _soft_fill(frame, bg, rgb, ys, xs)}


def _soft_fill(frame, bg, rgb, ys, xs) -> float:
    """Object area / bounding-box area from coverage, so that blur changes it little.

    Coverage of a pixel = its projection on background → object colour (about 1 inside, 0
    outside). Area = summed coverage over the box grown by ``GROW`` pixels (blur moves mass,
    it does not create it); width = summed per-column peak coverage across the box grown by
    ``EDGE`` pixels sideways (a blurred straight edge keeps its integral), height likewise.
    Sharp discs measure 0.79 (pi/4), sharp squares 1.00; a hard pixel count instead lets the
    rounded corners of a blurred square pass for a circle.
    """
    g = max(GROW, EDGE)                                    # crop: box grown by g pixels
    wy, wx = max(0, int(ys.min()) - g), max(0, int(xs.min()) - g)
    win = frame[wy:int(ys.max()) + 1 + g, wx:int(xs.max()) + 1 + g]
    u = rgb - bg
    cover = (win - bg) @ u / max(float(u @ u), 1e-6)
    y0, y1 = int(ys.min()) - wy, int(ys.max()) + 1 - wy      # the box, in window coordinates
    x0, x1 = int(xs.min()) - wx, int(xs.max()) + 1 - wx
    area = cover[max(0, y0 - GROW):y1 + GROW, max(0, x0 - GROW):x1 + GROW].sum()
    peak = np.clip(cover, 0.0, 1.0)
    width = peak[y0:y1, max(0, x0 - EDGE):x1 + EDGE].max(axis=0).sum()
    height = peak[max(0, y0 - EDGE):y1 + EDGE, x0:x1].max(axis=1).sum()
    return float(area / max(width * height, 1e-6))


def nearest_colour(rgb) -> str | None:
    """Vocabulary colour nearest to ``rgb`` (Euclidean), ``None`` beyond ``MAX_COLOUR_DISTANCE``."""
    names = list(COLOURS)
    dist = np.linalg.norm(np.asarray(list(COLOURS.values())) - np.asarray(rgb), axis=-1)
    i = int(np.argmin(dist))
    return names[i] if dist[i] <= MAX_COLOUR_DISTANCE else None


def _direction(disp: tuple[float, float]) -> str | None:
    dy, dx = disp
    if max(abs(dy), abs(dx)) < MIN_MOTION:
        return None
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


def measure(video) -> Measurement:
    """Measure ``video`` (``[F, H, W, 3]``, float in [0, 1] or uint8); never raises on content."""
    v = _as_float_video(video)
    f, h, w, _ = v.shape
    found = [(i, o) for i, o in enumerate(find_object(fr) for fr in v) if o is not None]
    if len(found) < max(2, (f + 1) // 2):
        return Measurement(f, len(found), None, None, None, None, None, None)
    rgb = np.median(np.stack([o["rgb"] for _, o in found]), axis=0)
    fill = float(np.median([o["fill"] for _, o in found]))
    cent = np.asarray([o["centroid"] for _, o in found])            # [found, 2] (y, x)
    k = max(1, len(found) // 4)
    dy, dx = (cent[-k:].mean(0) - cent[:k].mean(0)) / np.asarray([h, w])
    disp = (float(dy), float(dx))
    return Measurement(f, len(found), tuple(float(c) for c in rgb), nearest_colour(rgb), fill,
                       "square" if fill >= SQUARE_FILL else "circle", disp, _direction(disp))


def score(video, prompt: str) -> dict:
    """Compare ``video`` with the canonical ``prompt`` (``a {colour} {shape} moves {direction}``).

    Returns ``colour_correct``, ``shape_correct``, ``direction_correct`` (bools),
    ``all_correct``, and the measured values (``colour``, ``shape``, ``direction``, ``rgb``,
    ``fill``, ``displacement``, ``found_frames``, ``num_frames``). A prompt outside the
    vocabulary raises :class:`ditax.errors.RequestError`.
    """
    want = parse_prompt(prompt)
    m = measure(video)
    out = {"prompt": want.prompt,
           "colour_correct": m.colour == want.colour,
           "shape_correct": m.shape == want.shape,
           "direction_correct": m.direction == want.direction}
    out["all_correct"] = all(out[f"{k}_correct"] for k in ("colour", "shape", "direction"))
    out.update(dataclasses.asdict(m))
    return out


__all__ = ["Measurement", "find_object", "nearest_colour", "measure", "score", "MIN_CONTRAST",
           "SQUARE_FILL", "MAX_COLOUR_DISTANCE", "MIN_MOTION"]
