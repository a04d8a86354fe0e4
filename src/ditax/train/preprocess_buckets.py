"""``ditax preprocess --buckets`` / ``--bucket-area``: the pre-pass that puts every clip in a
bucket (:mod:`ditax.train.buckets`) and the encoding of the buckets (``meta.json`` version 2).

The pre-pass (:func:`plan_buckets`) reads no frame: captions (every clip of the folder), each
clip's size and frame count from ffmpeg's header and packet count, its bucket, the files more
than :data:`~ditax.train.preprocess.TINY` times smaller than their bucket, and VACE sidecars
(reference counts over all clips, each mask binary for its bucket's frames). Every problem is
listed in one :class:`~ditax.errors.RequestError` (exit 2) before any encoder loads. A clip
that fits no bucket (shorter than every bucket of its size, or a still without a frame-1
bucket) is not a problem but a skip: one line each, said before any encoding, and listed in
``meta.json`` ``skipped``; a run in which no clip fits any bucket is refused (exit 2).

The encoding (:func:`encode_buckets`) takes the buckets in their order, each bucket's clips in
file-name order, ``--batch`` clips an encoder call (the last call of a bucket padded with a
copy of its last clip, whose outputs are dropped: one compiled program a bucket, and a clip's
latents are the same whichever clips share its call), each clip scaled to cover its bucket and
center-cropped.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

from ditax.train.buckets import Bucket, BucketSet, assign, probe_all


@dataclass
class Clip:
    """A clip of the pre-pass: its file, caption, bucket, source ``(w, h)`` and the frames
    ffmpeg counted."""

    path: pathlib.Path
    caption: str
    bucket: Bucket
    size: tuple[int, int]
    frames: int


@dataclass
class BucketPlan:
    """What a bucketed run (or one process's part of it) encodes. ``samples``: every
    ``(path, caption)`` of the folder in file-name order; ``chunk``: this process's
    ``[start, end)`` of them; ``clips``: the chunk's clips that fit a bucket, in order;
    ``skipped``: ``{"file", "why"}`` of the chunk's clips that fit none."""

    buckets: BucketSet
    samples: list
    chunk: tuple[int, int]
    clips: list[Clip] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Clips per bucket name (buckets with clips), in bucket order."""
        out = {b.name: 0 for b in self.buckets.buckets}
        for c in self.clips:
            out[c.bucket.name] += 1
        return {k: v for k, v in out.items() if v}


def plan_buckets(videos, buckets: BucketSet, *, part: tuple[int, int] = (0, 1),
                 workers: int = 4, say=print) -> BucketPlan:
    """The pre-pass of a bucketed run over folder ``videos`` (module docstring): the clips of
    process ``part = (K, N)``'s chunk (:func:`chunk`; ``(0, 1)``: all) probed, bucketed and
    checked; every problem raised in one :class:`~ditax.errors.RequestError`; one line
    ``say``-ed per skipped clip."""
    from ditax.train.clip_files import sidecar_problems
    from ditax.train.clip_reading import TINY
    from ditax.train.preprocess_common import checked_samples, list_samples

    folder = pathlib.Path(videos)
    samples, problems = list_samples(folder)
    start, end = chunk(len(samples), *part)
    plan = BucketPlan(buckets, samples, (start, end))
    mine = samples[start:end]
    probed = probe_all([p for p, _ in mine], workers)
    for path, caption in mine:
        got = probed[path]
        if isinstance(got, Exception):
            problems.append(str(got))
            continue
        size, frames = got
        b, why = assign(size, frames, buckets.buckets)
        if b is None:
            plan.skipped.append({"file": path.name, "why": why})
            continue
        w, h = size
        if w * TINY < b.width or h * TINY < b.height:
            problems.append(f"{path.name} is {w}x{h} (WxH), more than {TINY}x smaller than its "
                            f"bucket {b.name} on a side (an upscale that trains on blur); "
                            f"remove it, or give smaller buckets")
            continue
        plan.clips.append(Clip(path, caption, b, size, frames))
    problems += sidecar_problems([p for p, _ in samples], {c.path: c.bucket.frames
                                                          for c in plan.clips},
                                 masked=[c.path for c in plan.clips])
    checked_samples(folder, samples, problems)
    for s in plan.skipped:
        say(f"skip {s['file']}: {s['why']}")
    per = ", ".join(f"{k} {v}" for k, v in plan.counts().items()) or "none"
    say(f"{len(plan.clips)} clip(s) to encode: {per}; {len(plan.skipped)} skipped")
    return plan


def resolve_buckets(*, buckets=None, bucket_area=None, height=None, width=None, frames=None,
                    text_len, dtype, batch, resize="crop", family, model) -> BucketSet | None:
    """The bucket set of ``--buckets`` (a string ``"832x480x81,..."`` or a list of
    :class:`~ditax.train.buckets.Bucket`) or ``--bucket-area`` with ``frames`` (a list or
    ``"81,49,17"``; None: the folder's / family's frame count), each bucket checked as a
    single-shape run's sizes are (:func:`~ditax.train.preprocess_common.check_request`: the grid,
    memory, dtype, batch, text length); None without either (a single-shape run, where a
    list of frames is refused). Flags that do not go with buckets are refused, each in one
    :class:`~ditax.errors.RequestError` naming it and the fix."""
    from ditax.errors import RequestError
    from ditax.train.buckets import derive_buckets, given_buckets, parse_buckets, parse_frames
    from ditax.train.preprocess_common import check_request, request_defaults

    if buckets is None and bucket_area is None:
        if isinstance(frames, (list, tuple)) or "," in str(frames):
            raise RequestError(f"--frames {frames}: a list of frame counts is for "
                               f"--bucket-area; give one number, or --bucket-area PIXELS")
        return None
    if buckets is not None and bucket_area is not None:
        raise RequestError("--buckets and --bucket-area: give one (--buckets lists the "
                           "buckets, --bucket-area derives them)")
    flag = "--buckets" if buckets is not None else "--bucket-area"
    for name, v in (("--height", height), ("--width", width)):
        if v is not None:
            raise RequestError(f"{name} {v} with {flag}: each bucket has its own size; drop "
                               f"{name}")
    if resize != "crop":
        raise RequestError(f"--resize {resize} with {flag}: a bucketed run scales each clip "
                           f"to cover its bucket and crops the center, never stretches; drop "
                           f"--resize")
    if buckets is not None:
        if frames is not None:
            raise RequestError(f"--frames {frames} with --buckets: each bucket names its frames "
                               f"(WIDTHxHEIGHTxFRAMES); drop --frames")
        listed = parse_buckets(buckets) if isinstance(buckets, str) else list(buckets)
        bset = given_buckets(listed, family, model)
    else:
        counts = parse_frames(",".join(map(str, frames)) if isinstance(frames, (list, tuple))
                              else frames if frames is not None
                              else request_defaults(model, family)["frames"])
        bset = derive_buckets(bucket_area, counts, family, model)
    for b in bset.buckets:
        try:
            check_request(height=b.height, width=b.width, frames=b.frames, text_len=text_len,
                          dtype=dtype, batch=batch, family=family, model=model)
        except RequestError as e:
            raise RequestError(f"bucket {b.name}: {e}" if "--height" in str(e) else str(e)
                               ) from None
    return bset


def chunk(n: int, k: int, num: int) -> tuple[int, int]:
    """Process ``k`` of ``num``'s contiguous share ``[k n // num, (k + 1) n // num)`` of ``n``
    sorted clips (so the parts, concatenated in ``k`` order, are the sorted list)."""
    return k * n // num, (k + 1) * n // num


def no_fit_error(skipped: list[dict]):
    """The :class:`~ditax.errors.RequestError` of a run in which no clip fits any bucket."""
    from ditax.errors import RequestError

    said = "; ".join(f"{s['file']}: {s['why']}" for s in skipped[:5])
    return RequestError(f"no clip fits any bucket ({len(skipped)} skipped: {said}"
                        f"{'; …' if len(skipped) > 5 else ''}); give buckets the clips fit")


def encode_buckets(plan: BucketPlan, writer, enc, *, text_len: int, batch: int, say=print,
                   prefix: str = "") -> int:
    """Encode ``plan``'s clips with the encoders ``enc`` into ``writer`` (a
    :class:`~ditax.train.bucket_writer.BucketWriter`), bucket by bucket (module docstring);
    one progress line a clip (``prefix`` before it, e.g. the part). Returns the count."""
    from ditax.io.files import VideoReadError
    from ditax.train.clip_reading import _read_jobs
    from ditax.train.preprocess_common import _groups, encode_group, shapes_said

    done, total = 0, len(plan.clips)
    for b in plan.buckets.buckets:
        clips = [c for c in plan.clips if c.bucket == b]
        if not clips:
            continue
        videos = _read_jobs([(c.path, b.frames, b.height, b.width, "crop") for c in clips])
        samples = ((c.path, c.caption) for c in clips)
        try:
            for group in _groups(zip(samples, videos), batch):
                for path, _, lat, text, mask, cond in encode_group(
                        enc, group, frames=b.frames, height=b.height, width=b.width,
                        resize="crop", text_len=text_len, pad=batch):
                    if lat is None:     # the encoders refused it (SkipClip): cond says why
                        plan.skipped.append({"file": path.name, "why": cond})
                        say(f"{prefix}{path.name}: skipped, {cond}")
                        continue
                    writer.add(b, lat, text, mask, **cond)
                    done += 1
                    say(f"{prefix}[{done}/{total}] {path.name} -> {b.name}: latents "
                        f"{tuple(lat.shape)}{shapes_said(cond)}")
        except VideoReadError as e:
            raise VideoReadError(f"{e} (bucket {b.name}: ffmpeg counted enough packets, the "
                                 f"decoder gives fewer frames; re-encode the clip)") from None
    return done


def closing_line(counts: dict, skipped: list, what: str = "") -> str:
    """The last line of a bucketed run: samples per bucket, the skipped clips, the policy."""
    per = ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
    return (f"{what}{sum(counts.values())} samples in {len(counts)} bucket(s): {per}; "
            f"{len(skipped)} clip(s) skipped (fit no bucket); resize=crop (center, cover), "
            f"never stretched")


__all__ = ["BucketPlan", "Clip", "chunk", "closing_line", "encode_buckets", "no_fit_error",
           "plan_buckets", "resolve_buckets"]
