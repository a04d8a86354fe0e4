"""Still images of the demo world (issue 26, the small Flux): one bright circle or square of a
vocabulary colour at the left / right / top / bottom of a dark image; canonical caption
``a {colour} {shape} on the {position}``; five combinations held out of training.

Colours, shapes and the drawing (exact pixel coverage, dark plain background) are those of
the clips (:mod:`ditax.synthetic.vocab`, :mod:`ditax.synthetic.clips`); only the motion word
becomes a position. Placement: for ``left`` / ``right`` the centre lies in the outer
:data:`OUTER` of the width and within :data:`BAND` of the middle row (``top`` / ``bottom``
alike on the other axis), so the dominant offset from the image centre names the position.

:func:`score_image` measures an image (the object found as :func:`ditax.synthetic.score.
find_object` finds it in a frame) against its prompt: colour, shape, position.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import re
from typing import NamedTuple

import numpy as np

from ditax.errors import RequestError
from ditax.synthetic.vocab import COLOURS, SHAPES, Combo

POSITIONS: tuple[str, ...] = ("left", "right", "top", "bottom")
PROMPT_TEMPLATE = "a {colour} {shape} on the {position}"
OUTER = 0.32       # the centre's band along the position's axis, from the edge (of the extent)
BAND = 0.12        # the centre's offset from the middle across it (of the extent)
MIN_OFFSET = 0.08  # the scorer's: a centroid nearer the image centre is at no position


class Placed(NamedTuple):
    """One (colour, shape, position) combination."""

    colour: str
    shape: str
    position: str

    @property
    def prompt(self) -> str:
        return PROMPT_TEMPLATE.format(**self._asdict())


HELD_OUT: tuple[Placed, ...] = (
    Placed("red", "square", "top"), Placed("green", "circle", "left"),
    Placed("blue", "square", "bottom"), Placed("yellow", "circle", "right"),
    Placed("white", "square", "left"))
"""Never in training images; used to measure composition."""


def all_placements() -> list[Placed]:
    """All 40 combinations (colour, then shape, then position)."""
    return [Placed(*c) for c in itertools.product(COLOURS, SHAPES, POSITIONS)]


def seen_placements() -> list[Placed]:
    return [c for c in all_placements() if c not in HELD_OUT]


_CANONICAL = re.compile(r"a (\w+) (\w+) on the (\w+)")


def parse_image_prompt(text: str) -> Placed:
    """``a {colour} {shape} on the {position}`` → :class:`Placed`; else a RequestError."""
    m = _CANONICAL.fullmatch(" ".join(str(text).lower().split()))
    if m is None:
        raise RequestError(f"prompt {text!r} is not of the form {PROMPT_TEMPLATE!r} (e.g. "
                           f"{all_placements()[0].prompt!r})")
    for kind, word, allowed in zip(("colour", "shape", "position"), m.groups(),
                                   (COLOURS, SHAPES, POSITIONS)):
        if word not in allowed:
            raise RequestError(f"{kind} {word!r} is not in the vocabulary; use one of "
                               f"{', '.join(allowed)}")
    return Placed(*m.groups())


def make_image(seed, placed: Placed, height: int = 64, width: int = 64) -> np.ndarray:
    """One image of ``placed`` from ``seed``: float32 ``[H, W, 3]`` in [0, 1]."""
    from ditax.synthetic.clips import BACKGROUND_MAX, MARGIN, SIZE_RANGE, ClipSpec, coverage

    rng = np.random.default_rng(seed)
    size = float(rng.uniform(*SIZE_RANGE) * min(height, width))
    axis = 1 if placed.position in ("left", "right") else 0
    extent = (height, width)
    lo = MARGIN + size / 2
    along = rng.uniform(lo, max(lo, OUTER * extent[axis]))
    if placed.position in ("right", "bottom"):
        along = extent[axis] - along
    across = extent[1 - axis] * (0.5 + rng.uniform(-BAND, BAND))
    centre = [0.0, 0.0]
    centre[axis], centre[1 - axis] = along, across
    shade = rng.uniform(0.02, 0.16)
    bg = np.clip(shade + rng.uniform(-0.03, 0.03, size=3), 0.0, BACKGROUND_MAX)
    # a still clip of one frame: the clips' exact coverage, no travel
    spec = ClipSpec(Combo(placed.colour, placed.shape, "left"), size,
                    (float(centre[0]), float(centre[1])), 0.0, tuple(bg))
    a = coverage(spec, height, width, 1)[0][..., None]
    return ((1.0 - a) * bg + a * np.asarray(COLOURS[placed.colour])).astype(np.float32)


def write_image_dataset(folder, n: int, seed: int, height: int = 64,
                        width: int = 64) -> pathlib.Path:
    """``n`` PNGs of the seen combinations (balanced: a fresh shuffle of them per pass) as
    ``folder/img_00000.png ...`` and ``captions.jsonl`` (``file``, ``caption`` and the
    combination), the layout ``ditax preprocess`` reads. Returns ``folder``."""
    import PIL.Image

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pool, rng, combos = seen_placements(), np.random.default_rng([seed, 0x5EED]), []
    while len(combos) < n:
        combos += [pool[i] for i in rng.permutation(len(pool))]
    rows = []
    for i, placed in enumerate(combos[:n]):
        name = f"img_{i:05d}.png"
        img = make_image((seed, i), placed, height, width)
        PIL.Image.fromarray(np.round(img * 255).astype(np.uint8)).save(folder / name)
        rows.append({"file": name, "caption": placed.prompt, **placed._asdict(),
                     "seed": [seed, i]})
    (folder / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _position(cy: float, cx: float, h: int, w: int) -> str | None:
    dy, dx = cy / h - 0.5, cx / w - 0.5
    if max(abs(dy), abs(dx)) < MIN_OFFSET:
        return None
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "bottom" if dy > 0 else "top"


def score_image(image, prompt: str) -> dict:
    """Compare ``image`` (``[H, W, 3]``, float in [0, 1] or uint8) with the canonical
    ``prompt``: ``colour_correct``, ``shape_correct``, ``position_correct``, ``all_correct``
    and what was measured (``colour``, ``shape``, ``position``, ``rgb``, ``fill``,
    ``centroid``); an image without one compact bright object measures as nothing."""
    from ditax.synthetic.score import SQUARE_FILL, _as_float_video, find_object, nearest_colour

    want = parse_image_prompt(prompt)
    frame = _as_float_video(np.asarray(image)[None])[0]
    obj = find_object(frame)
    got = {"colour": None, "shape": None, "position": None, "rgb": None, "fill": None,
           "centroid": None}
    if obj is not None:
        h, w, _ = frame.shape
        got = {"colour": nearest_colour(obj["rgb"]),
               "shape": "square" if obj["fill"] >= SQUARE_FILL else "circle",
               "position": _position(*obj["centroid"], h, w),
               "rgb": tuple(float(c) for c in obj["rgb"]), "fill": float(obj["fill"]),
               "centroid": obj["centroid"]}
    out = {"prompt": want.prompt, **{f"{k}_correct": got[k] == getattr(want, k)
                                     for k in ("colour", "shape", "position")}}
    out["all_correct"] = all(out[f"{k}_correct"] for k in ("colour", "shape", "position"))
    return {**out, **got}


__all__ = ["POSITIONS", "PROMPT_TEMPLATE", "HELD_OUT", "Placed", "all_placements",
           "seen_placements", "parse_image_prompt", "make_image", "write_image_dataset",
           "score_image"]
