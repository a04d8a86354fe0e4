"""Shape buckets for ``ditax preprocess``: mixed material (landscape and portrait clips, stills,
clips of different lengths) encoded into one dataset of several shapes (``meta.json`` version 2,
:mod:`ditax.train.bucket_writer`).

A bucket is ``WIDTHxHEIGHTxFRAMES`` (pixels, pixel frames), e.g. ``832x480x81``. The set comes
from ``--buckets`` (given, checked: each on the family's latent grid) or ``--bucket-area
PIXELS`` with ``--frames F1,F2,...`` (:func:`derive_buckets`, as kohya / musubi-tuner derive
theirs). Every side is a multiple of the family's pixel step (:func:`pixel_step`: Wan 16 — the
VAE's 8x times the transformer's 2x2 patch; FLUX.1 16 — the VAE's 8x times the 2x2 packing).

A clip goes to a bucket by :func:`assign`: the bucket size nearest its aspect ratio (the
smallest ``|log(w/h) - log(W/H)|``, ties to the bucket listed first), and among the buckets of
that size the longest frame count the clip has (it keeps its first ``FRAMES`` frames). It is
scaled to cover the bucket (aspect kept) and center-cropped — never stretched. A clip shorter
than every bucket of its size is skipped with a line naming it and its frame count; a still
image is a clip of one frame, so it needs a frame-1 bucket of its size. The frame count of a
video is read without decoding (:func:`probe`).
"""

from __future__ import annotations

import math
import pathlib
import re
from dataclasses import dataclass

#: latent pixels per transformer token side: Wan's patch_size (1, 2, 2), FLUX.1's 2x2 packing
PATCH = 2
#: derived buckets span aspect ratios from 1:MAX_ASPECT (portrait) to MAX_ASPECT:1
MAX_ASPECT = 2.0
ASSIGN = ("the bucket size nearest the clip's aspect ratio (smallest |log(w/h) - log(W/H)|, "
          "ties to the bucket listed first), then the longest frame count <= the clip's "
          "frames among the buckets of that size (the clip's first FRAMES frames); a clip "
          "shorter than every bucket of its size is skipped")
RESIZE = "crop: scaled to cover WIDTHxHEIGHT (aspect kept, bicubic), center kept; never stretched"
COUNT = ("videos: ffmpeg's packet count of the first video stream (stream copy, no decoding); "
         "images: 1 frame")
_NAME = re.compile(r"\s*(\d+)x(\d+)x(\d+)\s*")


@dataclass(frozen=True)
class Bucket:
    """One shape of a bucketed dataset: ``width x height`` pixels, ``frames`` pixel frames."""

    width: int
    height: int
    frames: int

    @property
    def name(self) -> str:
        """``WIDTHxHEIGHTxFRAMES``: the bucket's folder and its name in ``meta.json``."""
        return f"{self.width}x{self.height}x{self.frames}"

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height


@dataclass(frozen=True)
class BucketSet:
    """The buckets of a run in their order (as given, or as derived) and how they came about
    (``policy``: recorded as ``meta.json`` ``bucket_policy``)."""

    buckets: tuple[Bucket, ...]
    policy: dict


def _fail(message: str):
    from ditax.errors import RequestError

    return RequestError(message)


def parse_buckets(text: str) -> list[Bucket]:
    """``"832x480x81,480x832x81"`` as buckets, in order; a malformed item (not three positive
    integers ``WIDTHxHEIGHTxFRAMES``) or one named twice is a
    :class:`~ditax.errors.RequestError` naming it."""
    out: list[Bucket] = []
    for item in str(text).split(","):
        m = _NAME.fullmatch(item)
        if not m:
            raise _fail(f"--buckets {item.strip()!r}: not WIDTHxHEIGHTxFRAMES; give a "
                        f"comma-separated list such as 832x480x81,480x832x81")
        b = Bucket(*(int(v) for v in m.groups()))
        if min(b.width, b.height, b.frames) < 1:
            raise _fail(f"--buckets {b.name}: width, height and frames must be at least 1")
        if b in out:
            raise _fail(f"--buckets {b.name} is named twice; give each bucket once")
        out.append(b)
    return out


def parse_frames(text) -> list[int]:
    """``--frames "81,49,17"`` (or an int) as a list of frame counts, in order; a value that
    is no positive integer, or one given twice, is a :class:`~ditax.errors.RequestError`."""
    out: list[int] = []
    for item in str(text).split(","):
        if not item.strip().isdigit() or int(item) < 1:
            raise _fail(f"--frames {item.strip()!r}: not a positive integer; give frame counts "
                        f"such as 81,49,17")
        if int(item) in out:
            raise _fail(f"--frames {int(item)} is given twice; give each frame count once")
        out.append(int(item))
    return out


def _grid(family: str, model, frames: int, height: int, width: int):
    """The family's latent ``(F, Y, X)`` of a size (its folder's VAE), or the ConfigError."""
    from ditax.errors import ConfigError
    from ditax.models.base import family_class

    try:
        return family_class(family).folder_latent_grid(model, frames, height, width)
    except ConfigError as e:
        return e


def _side_ok(family, model, frames_ok: int, side: int) -> bool:
    g = _grid(family, model, frames_ok, side, side)
    return not isinstance(g, Exception) and g[1] % PATCH == 0


def _valid_frames(family, model) -> int:
    """A frame count the family takes (its default: Wan 81, FLUX.1 1)."""
    from ditax.models.base import family_class

    return family_class(family).default_frames


def pixel_step(family: str, model) -> int:
    """The side step of a family's buckets: its size rule's for ``model``'s folder
    (:meth:`~ditax.models.base.ModelFamily.size_rule`: the VAE's factor x the transformer's
    patch; Wan 2.1: 16, the Wan demo's 4x VAE and 4x4 patch: 16, FLUX.1: 16, a Flux folder
    with a 4x VAE: 8, LTX-2: 32). A family that declares no rule: the smallest side its
    latent grid takes whose latent side is a multiple of :data:`PATCH`."""
    from ditax.models.base import family_class

    rule = family_class(family).size_rule(model)
    if rule.spatial > 1:
        return rule.spatial
    f = _valid_frames(family, model)
    for s in range(1, 1025):
        if _side_ok(family, model, f, s):
            return s
    raise _fail(f"no side up to 1024 pixels is on the {family} latent grid")   # never, today


def _nearest(v: int, ok) -> int:
    """The value nearest ``v`` (>= 1) that ``ok`` accepts, the smaller one on a tie."""
    for d in range(0, 4096):
        for c in (v - d, v + d):
            if c >= 1 and ok(c):
                return c
    return v


def check_bucket(b: Bucket, family: str, model, step: int, flag: str = "--buckets") -> None:
    """Raise a :class:`~ditax.errors.RequestError` naming ``b`` and the nearest bucket that the
    family takes when ``b`` is off its latent grid: sides multiples of ``step``
    (:func:`pixel_step`), frames the VAE takes (Wan 4k+1, FLUX.1 1)."""
    def frames_ok(f):
        return not isinstance(_grid(family, model, f, step, step), Exception)

    def side_ok(s):
        return s % step == 0

    fix = Bucket(_nearest(b.width, side_ok), _nearest(b.height, side_ok),
                 _nearest(b.frames, frames_ok))
    name = family.capitalize()
    if fix == b:
        g = _grid(family, model, b.frames, b.height, b.width)
        if not isinstance(g, Exception):
            return
        raise _fail(f"{flag} {b.name}: {g}")
    why = []
    if not frames_ok(b.frames):
        why.append(str(_grid(family, model, b.frames, step, step)).split(";")[0])
    if flag == "--frames":
        raise _fail(f"--frames {b.frames}: {why[0]}; the nearest valid count is {fix.frames}")
    if fix.size != b.size:
        from ditax.models.base import family_class

        rule = family_class(family).size_rule(model)
        why.append(f"width and height must be multiples of {step} ("
                   + (rule.why if rule.spatial == step else f"the {name} VAE's factor times "
                      f"the transformer's {PATCH}x{PATCH} patch") + ")")
    raise _fail(f"{flag} {b.name} is not on the {name} latent grid: {'; '.join(why)}; the "
                f"nearest valid bucket is {fix.name}")


def derive_buckets(area: int, frames: list[int], family: str, model) -> BucketSet:
    """Buckets of at most ``area`` pixels for each of ``frames``, as kohya / musubi-tuner
    derive them. With ``s`` = :func:`pixel_step`:

    1. for every width ``w = s, 2s, 3s, ...``: ``h = s * floor(area / (w * s))``, the tallest
       multiple of ``s`` with ``w * h <= area``; kept when ``h >= s`` and ``1/MAX_ASPECT <=
       w / h <= MAX_ASPECT`` (:data:`MAX_ASPECT` = 2);
    2. plus the square ``q x q``, ``q = s * floor(sqrt(area) / s)``;
    3. each size once, ordered by aspect ratio ``w / h`` (tallest first), then by area
       (largest first); every size with every frame count of ``frames`` (in the order given).

    The frame counts are checked on the family's grid (Wan 4k+1; FLUX.1: 1 only); an area
    that holds no size is a :class:`~ditax.errors.RequestError`."""
    from ditax.numbers import INT_LIMIT

    if isinstance(area, bool) or not isinstance(area, int) or not 1 <= area < INT_LIMIT:
        raise _fail(f"--bucket-area {area}: must be an integer from 1 to {INT_LIMIT - 1} "
                    f"(pixels per frame, e.g. 399360 for 832x480)")
    step = pixel_step(family, model)
    for f in frames:
        check_bucket(Bucket(step, step, f), family, model, step, flag="--frames")
    q = step * (math.isqrt(area) // step)
    if q < step:
        raise _fail(f"--bucket-area {area}: holds no bucket; the smallest is {step}x{step} = "
                    f"{step * step} pixels (sides are multiples of {step})")
    sizes = {(q, q)}
    for w in range(step, area // step + 1, step):
        h = step * (area // (w * step))
        if h >= step and 1 / MAX_ASPECT <= w / h <= MAX_ASPECT:
            sizes.add((w, h))
    ordered = sorted(sizes, key=lambda wh: (wh[0] / wh[1], -wh[0] * wh[1]))
    buckets = tuple(Bucket(w, h, f) for w, h in ordered for f in frames)
    policy = {"kind": "area", "area": area, "frames": list(frames), "step": step,
              "max_aspect": MAX_ASPECT,
              "derivation": "for every width w = step, 2 step, ...: h = step * floor(area / "
                            "(w * step)), kept when h >= step and 1/max_aspect <= w/h <= "
                            "max_aspect; plus the square q = step * floor(sqrt(area) / step); "
                            "sizes ordered by w/h, then area (largest first); each with every "
                            "frame count",
              **_common(buckets)}
    return BucketSet(buckets, policy)


def given_buckets(buckets: list[Bucket], family: str, model) -> BucketSet:
    """The ``--buckets`` set, each checked (:func:`check_bucket`), in the order given."""
    step = pixel_step(family, model)
    for b in buckets:
        check_bucket(b, family, model, step)
    return BucketSet(tuple(buckets), {"kind": "given", "step": step, **_common(buckets)})


def _common(buckets) -> dict:
    return {"buckets": [b.name for b in buckets], "assign": ASSIGN, "resize": RESIZE,
            "frame_count": COUNT}


def assign(size: tuple[int, int], frames: int, buckets) -> tuple[Bucket | None, str]:
    """The bucket of a clip of ``size`` ``(w, h)`` and ``frames`` frames (the rule of the
    module docstring), or ``(None, why)``: the reason it fits none, with the fix."""
    w, h = size
    sizes = list(dict.fromkeys(b.size for b in buckets))        # in bucket order
    target = math.log(w / h)
    near = min(sizes, key=lambda s: round(abs(target - math.log(s[0] / s[1])), 9))
    fits = [b for b in buckets if b.size == near and b.frames <= frames]
    if fits:
        return max(fits, key=lambda b: b.frames), ""
    shortest = min(b.frames for b in buckets if b.size == near)
    where = f"the buckets of size {near[0]}x{near[1]}, the nearest to its {w}x{h}"
    if frames == 1:
        return None, (f"a still image (1 frame) and no frame-1 bucket among {where}; add "
                      f"{near[0]}x{near[1]}x1 to --buckets (or 1 to --frames) to keep it")
    return None, (f"{frames} frames, fewer than the {shortest} of the shortest of {where}; add "
                  f"a shorter bucket to keep it")


def probe(path) -> tuple[tuple[int, int], int]:
    """``((w, h), frames)`` of a clip without decoding it: an image is one frame (its size from
    the header, PIL); a video's size (as displayed: a rotated clip upright) and frame count
    come from one ``ffmpeg -i FILE -map 0:v:0 -c copy -f null -`` — the packets of its first
    video stream counted, not decoded (fast; ``imageio_ffmpeg.count_frames_and_secs`` decodes
    the whole clip). Caveat: a file whose container trims frames (an edit list) or whose
    decoder drops some can decode fewer frames than counted; the encoding then names the clip.
    An unreadable file is a :class:`~ditax.io.files.VideoReadError` naming it."""
    import subprocess

    import imageio_ffmpeg

    from ditax.io.files import video_error
    from ditax.train.clip_files import IMAGE_EXT
    from ditax.train.clip_reading import _source_size, source_size

    if pathlib.Path(path).suffix.lower() in IMAGE_EXT:
        return source_size(path), 1
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", str(path),
           "-map", "0:v:0", "-c", "copy", "-f", "null", "-"]
    try:
        run = subprocess.run(cmd, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise video_error(path, e) from None
    text = run.stderr.decode(errors="replace")
    counts = re.findall(r"frame=\s*(\d+)", text)
    if run.returncode or not counts:
        raise video_error(path, RuntimeError(text.strip().splitlines()[-1] if text.strip()
                                             else f"ffmpeg exit {run.returncode}"))
    try:
        from imageio_ffmpeg._parsing import parse_ffmpeg_header

        size = _source_size(parse_ffmpeg_header(text))
    except Exception:       # noqa: BLE001 — a header imageio cannot parse: ask ffmpeg again
        size = source_size(path)
    return size, int(counts[-1])


def probe_all(paths, workers: int = 4) -> dict:
    """:func:`probe` of every path, ``workers`` at a time: ``{path: ((w, h), frames)}``, or the
    :class:`~ditax.io.files.VideoReadError` of a file that cannot be read."""
    from concurrent.futures import ThreadPoolExecutor

    from ditax.io.files import VideoReadError
    from ditax.io.video import _ffmpeg_subprocess

    def one(p):
        try:
            return probe(p)
        except VideoReadError as e:
            return e

    paths = list(paths)
    with _ffmpeg_subprocess(), ThreadPoolExecutor(max(1, workers)) as pool:
        return dict(zip(paths, pool.map(one, paths)))


__all__ = ["Bucket", "BucketSet", "assign", "check_bucket", "derive_buckets", "given_buckets",
           "parse_buckets", "parse_frames", "pixel_step", "probe", "probe_all"]
