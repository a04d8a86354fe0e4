"""``ditax preprocess VIDEOS OUT --model PIPELINE``: videos + captions → latent dataset.

Each video in ``VIDEOS`` (``.mp4 .mov .webm .mkv .avi``; a still image ``.png .jpg .jpeg
.webp .bmp`` is a clip of one frame, read with PIL and resized bicubic) needs a caption: a sidecar
``name.txt`` or a line ``{"file": "name.mp4", "caption": "..."}`` in ``VIDEOS/captions.jsonl``.
Frames are read with ffmpeg (imageio-ffmpeg), brought to ``--width × --height`` by the resize
policy ``--resize`` (:data:`RESIZE`: ``crop``, the default, scales the frame to cover the target
with its aspect ratio kept and keeps the center, as common trainers do; ``stretch`` scales each
side on its own, distorting a file of another aspect ratio), the first ``--frames`` (Wan: 4k+1)
kept. The policy and the files of another aspect ratio are recorded in ``meta.json``
(``resize``, ``other_aspect_ratio``) and said in the closing line. A file more than
:data:`TINY` times smaller than the target on a side is refused before any encoding (an
upscale that large trains on blur). The model family's encoders (Wan: the pipeline's VAE,
posterior mean normalised with the VAE's latents mean/std — the space the transformer is
trained in — and its UMT5, captions padded to ``--text-len`` tokens, zeros past the prompt,
mask saved) turn them into training samples. An image-to-video folder (Wan I2V) also stores
each clip's first-frame condition: mask + condition latents, and for Wan 2.1 the CLIP features
of the first frame (the family's :meth:`~ditax.models.base.Encoders.encode_condition`); Wan 2.2
TI2V needs nothing extra (its condition is the clip's first latent frame). A VACE folder
(``WanVACEPipeline``) stores each clip's control context (``control``: inactive / reactive
latents, the folded mask, reference latents, as the pipeline builds them) from the clip's
sidecar files, read like the clip (the same resize policy): ``NAME.control.mp4`` (the control
video; none: the clip itself when there is a mask, else no control), ``NAME.mask.mp4`` (white =
generate, black = keep; binary as a file, and resized nearest-neighbour — never blended — so it
stays binary), ``NAME.ref.png``, ``NAME.ref2.png``... (reference images, whose latent frames
also go before the clip's latents: the frames VACE denoises; every clip of a dataset needs the
same number; whatever the policy, each is fitted inside the target on a white canvas, aspect
kept, as the VACE pipeline fits them at inference). Reference counts that differ and a mask
frame that is not binary are named with their files before any encoding
(:func:`~ditax.train.clip_files.sidecar_problems`). Extra text outputs of a
family's encoder (:class:`~ditax.models.base.TextEncoding` ``extra``, e.g. a pooled vector) are
stored with each sample like its condition entries. The result is the ArrayRecord dataset of
:mod:`ditax.train.data`.

Mixed material (landscape and portrait clips, stills, different lengths) goes into one dataset
of several shapes with ``--buckets`` / ``--bucket-area`` (:mod:`ditax.train.buckets`,
:mod:`ditax.train.preprocess_buckets`; ``meta.json`` version 2), and N processes write one
dataset with ``--num-processes N --process-id K`` (:mod:`ditax.train.preprocess_parts`).
:func:`prepare` checks a run before any model loads; :func:`run` encodes it.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

import numpy as np

from ditax.train.clip_files import sidecar_problems
from ditax.train.clip_reading import (RESIZE, TINY, _decode, _read_clips,  # noqa: F401
                                      _read_jobs, _source_size, other_aspect, read_sidecars,
                                      read_video, read_videos, size_problems, source_size)
from ditax.train.preprocess_common import (  # noqa: F401  (re-exported)
    find_samples, list_samples, checked_samples, encode_group, shapes_said, _groups, DTYPES,
    _machine_bytes, folder_family, default_frames, request_defaults, check_request, check_output,
    check_model)


def preprocess(videos, output, model, *, height=None, width=None, frames=None, text_len=None,
               dtype="float32", family=None, batch=1, resize="crop", say=print,
               buckets=None, bucket_area=None, num_processes=None,
               process_id=None) -> pathlib.Path:
    """Encode every (video, caption) of ``videos`` into a dataset at ``output`` with the
    encoders of the pipeline folder ``model`` (of model family ``family``; None: the folder's,
    :func:`folder_family`), ``batch`` clips per encoder call (small clips: 8 is ~20% faster
    on CPU than 1, same latents). ``height``, ``width``, ``frames``, ``text_len`` left at None:
    the folder's ``ditax_sample.json``, else the family's (:func:`request_defaults`).
    ``resize`` (:data:`RESIZE`): how a file of another aspect ratio meets ``width x height``
    — ``crop`` (scale to cover, keep the center) or ``stretch``; ``meta.json`` records it
    (``resize``) with the names of the clips of another aspect ratio (``other_aspect_ratio``),
    and the last line ``say`` gets counts them.

    ``buckets`` (``"832x480x81,480x832x81"``) or ``bucket_area`` (pixels, with ``frames`` a
    list such as ``"81,49,17"``): a dataset of several shapes (``meta.json`` version 2;
    :mod:`ditax.train.preprocess_buckets`). ``num_processes`` / ``process_id``: this process
    writes its part of the dataset, and the one that completes the last part writes
    ``meta.json`` (:mod:`ditax.train.preprocess_parts`).

    Every argument is checked before a model loads (:func:`prepare`). The dataset (or part)
    is written into a hidden temporary folder and renamed when complete, so a failure or an
    interrupt leaves no half-written dataset (the temporary folder is removed); a write that
    fails (the disk full, a quota, no permission) is :class:`~ditax.io.outputs.WriteFailed`
    naming ``output`` and the cause."""
    job = prepare(videos, output, model, height=height, width=width, frames=frames,
                  text_len=text_len, dtype=dtype, family=family, batch=batch, resize=resize,
                  say=say, buckets=buckets, bucket_area=bucket_area,
                  num_processes=num_processes, process_id=process_id)
    return run(job, say=say)


@dataclass
class Job:
    """A checked preprocess run (:func:`prepare`), ready to encode (:func:`run`).
    ``samples``: the ``(path, caption)`` pairs this process encodes (one shape; a bucketed run:
    ``plan``); ``part``: ``(K, N)`` (``(0, 1)``: one process); ``complete``: the parts'
    ``meta.json`` is written already; ``settings``: what every part must share."""

    videos: pathlib.Path
    output: pathlib.Path
    model: str
    family: str
    dtype: str
    batch: int
    text_len: int
    resize: str
    height: int | None = None
    width: int | None = None
    frames: int | None = None
    buckets: object = None        # a BucketSet
    plan: object = None           # a BucketPlan
    samples: list = field(default_factory=list)
    part: tuple[int, int] = (0, 1)
    complete: bool = False
    settings: dict | None = None


def prepare(videos, output, model, *, height=None, width=None, frames=None, text_len=None,
            dtype="float32", family=None, batch=1, resize="crop", say=print, buckets=None,
            bucket_area=None, num_processes=None, process_id=None) -> Job:
    """Check every argument and the clips before any model loads and return the :class:`Job`
    (arguments of :func:`preprocess`): sizes (:func:`check_request`) or buckets
    (:func:`~ditax.train.preprocess_buckets.resolve_buckets`), the processes
    (:func:`~ditax.train.preprocess_parts.check_processes`), the output folder, the model
    path and the pre-pass over the clips (:func:`find_samples`; a bucketed run:
    :func:`~ditax.train.preprocess_buckets.plan_buckets`, whose skip lines ``say`` gets).
    Each problem is a :class:`~ditax.errors.RequestError` naming it (exit 2)."""
    from ditax.train import preprocess_parts as parts
    from ditax.train.preprocess_buckets import (chunk, no_fit_error, plan_buckets,
                                                resolve_buckets)

    family = folder_family(model) if family is None else family
    k, n = parts.check_processes(num_processes, process_id)
    d = request_defaults(model, family) if None in (height, width, frames, text_len) else {}
    text_len = d["text_len"] if text_len is None else text_len
    bset = resolve_buckets(buckets=buckets, bucket_area=bucket_area, height=height,
                           width=width, frames=frames, text_len=text_len, dtype=dtype,
                           batch=batch, resize=resize, family=family, model=model)
    job = Job(pathlib.Path(videos), pathlib.Path(output), model, family, dtype, batch,
              text_len, resize, buckets=bset, part=(k, n))
    if bset is None:
        size = dict(height=height, width=width, frames=_int_arg(frames))
        job.height, job.width, job.frames = (d[k2] if v is None else v for k2, v in size.items())
        check_request(height=job.height, width=job.width, frames=job.frames,
                      text_len=text_len, dtype=dtype, batch=batch, family=family, model=model,
                      resize=resize)
    if n == 1:
        check_output(output)
    else:
        job.complete = parts.check_parts_output(output, n) == "complete"
    check_model(model)
    if n > 1:      # every part must come from the same clips and settings: checked first
        listed, problems = list_samples(videos)
        job.settings = {"kind": "buckets" if bset else "single", "model": str(model),
                        "family": family, "dtype": dtype, "text_len": text_len,
                        "resize": resize, "clips": parts.clips_digest(listed),
                        "num_clips": len(listed),
                        **({"buckets": [b.name for b in bset.buckets]} if bset else
                           {"size": [job.width, job.height, job.frames]})}
        parts.check_settings(output, n, job.settings)
        own = parts.read_part(pathlib.Path(output) / parts.part_name(k, n))
        if job.complete or own is not None:
            return job          # nothing to encode: run() says so (and merges if it can)
    if bset is not None:
        job.plan = plan_buckets(videos, bset, part=(k, n), say=say)
        job.samples = job.plan.samples
        if n == 1 and not job.plan.clips:
            raise no_fit_error(job.plan.skipped)
    elif n == 1:
        job.samples = find_samples(videos, height=job.height, width=job.width,
                                   frames=job.frames)
    else:      # every caption and the reference counts; this process's chunk's files
        start, end = chunk(len(listed), k, n)
        mine = [v for v, _ in listed[start:end]]
        problems += size_problems(mine, job.height, job.width)
        problems += sidecar_problems([v for v, _ in listed], job.frames, masked=mine)
        job.samples = checked_samples(videos, listed, problems)[start:end]
    return job


def _int_arg(v):
    """``--frames`` of a single-shape run as an int when it is one (the CLI passes text)."""
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return v


def run(job: Job, say=print) -> pathlib.Path:
    """Encode a :class:`Job`: one process writes the dataset into a hidden folder renamed to
    the output when complete; process K of N writes its part, and the meta.json when all
    parts are complete (:mod:`ditax.train.preprocess_parts`)."""
    from ditax.io.outputs import atomic_folder
    from ditax.train import preprocess_parts as parts

    k, n = job.part
    if job.complete:
        say(f"{job.output} is complete (meta.json over {n} parts); nothing to do")
        return job.output
    if n > 1:
        if parts.write_part(job.output, k, n, job.settings,
                            lambda tmp: _write_part(job, tmp, say), say=say):
            say(f"{parts.part_name(k, n)} written")
        meta = parts.merge_parts(job.output, n, say=say)
        if meta is not None:
            _said_merged(meta, say)
        return job.output
    target = job.output.absolute()
    created = [p for p in target.parents if not p.exists()]      # nearest first
    try:
        with atomic_folder(target) as tmp:
            enc = _encoders(job)
            if job.buckets is None:
                _encode(job.samples, tmp, enc, height=job.height, width=job.width,
                        frames=job.frames, text_len=job.text_len, batch=job.batch,
                        model=job.model, resize=job.resize, say=say)
            else:
                _encode_buckets(job, tmp, enc, say)
    except BaseException:
        for p in created:            # and the parent folders made for it, while still empty
            try:
                p.rmdir()
            except OSError:
                break
        raise
    return job.output


def _encoders(job: Job):
    from ditax.models.base import family_class

    return family_class(job.family).load_encoders(pathlib.Path(job.model), dtype=job.dtype)


def _encode_buckets(job: Job, folder, enc, say, *, part: bool = False) -> dict:
    """A bucketed run's records into ``folder`` (:func:`~ditax.train.preprocess_buckets.
    encode_buckets`) and its meta: written as ``meta.json`` (one process), or returned (a
    part: ``meta.json`` is the merge's)."""
    from ditax.train.bucket_writer import BucketWriter, bucketed_meta
    from ditax.train.data_writer import save_null_text
    from ditax.train.preprocess_buckets import closing_line, encode_buckets

    w = BucketWriter(folder, [b.name for b in job.buckets.buckets])
    k, n = job.part
    encode_buckets(job.plan, w, enc, text_len=job.text_len, batch=job.batch, say=say,
                   prefix=f"part {k} of {n}: " if part else "")
    null = enc.encode_text([""], job.text_len)       # the unconditional branch's prompt
    null = dict(null_text=(np.asarray(null.embeddings[0], np.float32), null.mask[0]),
                null_extra={k2: v[0] for k2, v in null.extra.items()})
    extra = {"resize": "crop", "bucket_policy": job.buckets.policy, "skipped": job.plan.skipped,
             "model": str(job.model), "num_processes": 1}
    counts = {b["name"]: b["num_samples"] for b in w.summary()}
    say(closing_line(counts, job.plan.skipped, f"part {k} of {n}: " if part else ""))
    if not part:
        w.close(extra, **null)
        return {}
    buckets = w.finish()
    name = save_null_text(folder, null["null_text"], null["null_extra"])
    return bucketed_meta(buckets, w.text_shape, {"null_text": name, **extra})


def _write_part(job: Job, tmp, say) -> dict:
    """Process K's part into ``tmp``: ``num_samples``, ``meta`` (None: nothing to encode, and
    no model loaded) and ``skipped`` for its ``part.json``."""
    import json

    if job.buckets is not None:
        if not job.plan.clips:
            return {"num_samples": 0, "meta": None, "skipped": job.plan.skipped}
        meta = _encode_buckets(job, tmp, _encoders(job), say, part=True)
        return {"num_samples": meta["num_samples"], "meta": meta,
                "skipped": job.plan.skipped}
    if not job.samples:
        return {"num_samples": 0, "meta": None, "skipped": []}
    _encode(job.samples, tmp, _encoders(job), height=job.height, width=job.width,
            frames=job.frames, text_len=job.text_len, batch=job.batch, model=job.model,
            resize=job.resize, say=say)
    meta = json.loads((tmp / "meta.json").read_text())
    (tmp / "meta.json").unlink()          # the dataset's meta.json is the merge's
    return {"num_samples": meta["num_samples"], "meta": meta, "skipped": []}


def _said_merged(meta_path, say) -> None:
    """The closing line of a merged dataset: samples per bucket (one shape: its count)."""
    import json

    from ditax.train.data import dataset_buckets
    from ditax.train.preprocess_buckets import closing_line

    meta = json.loads(pathlib.Path(meta_path).read_text())
    if meta["version"] == 1:
        say(f"meta.json written over {meta['num_processes']} parts: {meta['num_samples']} "
            f"samples at {meta['width']}x{meta['height']}, {meta['frames']} frame(s)")
        return
    counts = {b["name"]: b["num_samples"] for b in dataset_buckets(meta)}
    say(closing_line(counts, meta["skipped"],
                     f"meta.json written over {meta['num_processes']} parts: "))


def _encode(samples, folder, enc, *, height, width, frames, text_len, batch, model, resize,
            say):
    """Write the dataset of ``samples`` into ``folder`` with the encoders ``enc``, each clip
    and its sidecars brought to ``width x height`` by ``resize``."""
    from ditax.train.data_writer import DatasetWriter

    w = DatasetWriter(folder)
    clips = _read_clips([path for path, _ in samples], frames, height, width, resize=resize)
    done, reshaped, skipped = 0, [], []
    for group in _groups(zip(samples, clips), batch):
        for path, size, lat, text, mask, cond in encode_group(
                enc, group, frames=frames, height=height, width=width, resize=resize,
                text_len=text_len):
            if lat is None:          # the encoders refused it (SkipClip): cond says why
                skipped.append({"file": path.name, "why": cond})
                say(f"{path.name}: skipped, {cond}")
                continue
            if other_aspect(size, height, width):
                reshaped.append(path.name)
            w.add(lat, text, mask, **cond)
            done += 1
            say(f"[{done}/{len(samples)}] {path.name}: latents {tuple(lat.shape)}"
                f"{shapes_said(cond)}")
    if skipped and not done:
        from ditax.errors import RequestError

        raise RequestError(f"every clip was skipped ({len(skipped)}: "
                           + "; ".join(f"{s['file']}: {s['why']}" for s in skipped[:3])
                           + ("; …" if len(skipped) > 3 else "") + "); nothing to write")
    null = enc.encode_text([""], text_len)       # the unconditional branch's prompt
    w.close({"height": height, "width": width, "frames": frames, "model": str(model),
             "resize": resize, "other_aspect_ratio": reshaped,
             **({"skipped": skipped} if skipped else {})},
            null_text=(np.asarray(null.embeddings[0], np.float32), null.mask[0]),
            null_extra={k: v[0] for k, v in null.extra.items()})
    how = "crop (center)" if resize == "crop" else resize
    verb = "cropped" if resize == "crop" else "stretched"
    left = f", {len(skipped)} clip(s) skipped" if skipped else ""
    say(f"{done} samples at {width}x{height}, {frames} frame(s): resize={how}, "
        f"{len(reshaped)} of {done} files {verb} from another aspect ratio{left}")
