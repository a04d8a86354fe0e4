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
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from ditax.train.clip_files import (IMAGE_EXT, VIDEO_EXT, check_sidecars,
                                    clip_sidecars, sidecar_kind, sidecar_problems)

RESIZE = ("crop", "stretch")     # --resize: the first is the default
TINY = 4     # a file more than this many times smaller than the target on a side is refused


def read_sidecars(path, accepted, num_frames: int, height: int, width: int, *,
                  resize: str = "stretch") -> dict:
    """The clip's sidecars read for its encoders (videos ``[3, F, H, W]`` in [-1, 1] like the
    clip, by the ``resize`` policy; the mask nearest-neighbour, so a binary mask stays binary;
    images as PIL, fitted by the encoders); a sidecar the family's encoders do not take
    (``accepted``) is a :class:`~ditax.errors.RequestError` naming it."""
    from ditax.errors import RequestError
    from ditax.io.images import read_image

    found = clip_sidecars(path)
    extra = [k for k in found if k not in accepted]
    if extra:
        names = [p.name for k in extra for p in (found[k] if k == "references" else [found[k]])]
        raise RequestError(f"{names[0]}: control / mask / reference sidecars are for a VACE "
                           f"pipeline folder (--model WanVACEPipeline); remove them or "
                           f"preprocess with a VACE folder")
    out = {k: read_video(p, num_frames, height, width, resize=resize, nearest=k == "mask")
           for k, p in found.items() if k != "references"}
    if "references" in found:
        out["references"] = [read_image(p, "reference image") for p in found["references"]]
    return out


def read_video(path, num_frames: int, height: int, width: int, *, resize: str = "stretch",
               nearest: bool = False) -> np.ndarray:
    """First ``num_frames`` frames brought to ``height × width`` by the ``resize`` policy
    (:data:`RESIZE`; ``crop``: scaled to cover, center kept; ``stretch``: each side scaled on
    its own — the default here, which ``ditax train-vae`` reads with; ``ditax preprocess``
    passes its ``--resize``), bicubic, or nearest-neighbour with ``nearest`` (masks): float32
    ``[3, F, H, W]`` in [-1, 1]."""
    from ditax.io.video import _ffmpeg_subprocess

    with _ffmpeg_subprocess():
        return _decode(path, num_frames, height, width, resize, nearest)[0]


def read_videos(paths, num_frames: int, height: int, width: int, *, workers: int = 4,
                ahead: int = 16, resize: str = "stretch"):
    """:func:`read_video` of every path, in order, decoded ``workers`` at a time (each by its
    own ffmpeg process, so they overlap with the caller's work); at most ``ahead`` decoded
    clips wait in memory."""
    for video, _ in _read_clips(paths, num_frames, height, width, workers=workers,
                                ahead=ahead, resize=resize):
        yield video


def _read_clips(paths, num_frames, height, width, *, workers=4, ahead=16, resize="stretch"):
    """:func:`read_videos`, each clip with its source size ``(w, h)``."""
    return _read_jobs([(p, num_frames, height, width, resize) for p in paths],
                      workers=workers, ahead=ahead)


def _read_jobs(jobs, *, workers=4, ahead=16):
    """``(video [3, F, H, W], source size (w, h))`` of each ``(path, frames, height, width,
    resize)`` of ``jobs`` (each clip its own size: a bucketed run), in order, decoded
    ``workers`` at a time; at most ``ahead`` decoded clips wait in memory."""
    import collections
    from concurrent.futures import ThreadPoolExecutor

    from ditax.io.video import _ffmpeg_subprocess

    jobs = list(jobs)
    # the warning filter is process-wide: set once here, not per thread (catch_warnings is not
    # thread-safe)
    with _ffmpeg_subprocess(), ThreadPoolExecutor(max(1, workers)) as pool:
        pending = collections.deque()
        for job in jobs:
            pending.append(pool.submit(_decode, *job))
            if len(pending) >= max(1, ahead):
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _scale_filter(height: int, width: int, resize: str, nearest: bool) -> str:
    """The ffmpeg ``-vf`` of a policy: ``crop`` scales to cover (aspect kept) and crops the
    center (``crop``'s default offsets are centered); ``stretch`` scales to the size."""
    flags = ":flags=neighbor" if nearest else ""     # else ffmpeg's default, bicubic
    if resize == "crop":
        return (f"scale={width}:{height}:force_original_aspect_ratio=increase{flags},"
                f"crop={width}:{height}")
    return f"scale={width}:{height}{flags}"


def _decode(path, num_frames: int, height: int, width: int, resize: str = "stretch",
            nearest: bool = False) -> tuple[np.ndarray, tuple[int, int]]:
    """One clip decoded, and its source size ``(w, h)``; a file ffmpeg cannot read, an empty
    file or a clip shorter than ``num_frames`` is a :class:`~ditax.io.files.VideoReadError`
    naming the clip."""
    import imageio_ffmpeg

    from ditax.io.files import video_error

    if resize not in RESIZE:
        raise ValueError(f"resize={resize!r} is not one of {', '.join(RESIZE)}")
    if pathlib.Path(path).suffix.lower() in IMAGE_EXT:
        return _decode_image(path, num_frames, height, width, resize, nearest)
    frames = []
    try:
        gen = imageio_ffmpeg.read_frames(str(path), output_params=[
            "-vf", _scale_filter(height, width, resize, nearest)])
        source = _source_size(next(gen))    # metadata (starts ffmpeg)
        for raw in gen:
            frames.append(np.frombuffer(raw, np.uint8).reshape(height, width, 3))
            if len(frames) == num_frames:
                break
        gen.close()
    except (OSError, RuntimeError, StopIteration, ValueError) as e:
        raise video_error(path, e) from None
    if len(frames) < num_frames:
        raise video_error(path, problem=f"has {len(frames)} frames, fewer than --frames="
                          f"{num_frames}", fix="lower --frames (4k+1) or remove the clip")
    v = np.stack(frames).astype(np.float32) / 127.5 - 1.0      # [F, H, W, 3]
    return v.transpose(3, 0, 1, 2), source


def _source_size(meta: dict) -> tuple[int, int]:
    """``(w, h)`` of the frames ffmpeg decodes (before the filter), as displayed: a clip
    stored rotated by 90 or 270 degrees is turned upright by ffmpeg."""
    w, h = meta.get("source_size") or meta["size"]
    return (h, w) if meta.get("rotate", 0) % 180 == 90 else (w, h)


def _decode_image(path, num_frames: int, height: int, width: int, resize: str = "stretch",
                  nearest: bool = False) -> tuple[np.ndarray, tuple[int, int]]:
    """A still image as a clip of one frame ``[3, 1, H, W]`` in [-1, 1] (``--frames 1``),
    and its size ``(w, h)``; ``crop``: ``PIL.ImageOps.fit`` (the centered region of the
    target's aspect ratio, scaled)."""
    import PIL.Image
    import PIL.ImageOps

    from ditax.io.files import video_error

    if num_frames != 1:
        raise video_error(path, problem=f"is a still image (1 frame), fewer than --frames="
                          f"{num_frames}", fix="use --frames 1 for images")
    how = PIL.Image.Resampling.NEAREST if nearest else PIL.Image.Resampling.BICUBIC
    try:
        with PIL.Image.open(path) as im:
            source = im.size
            im = im.convert("RGB")
            im = (PIL.ImageOps.fit(im, (width, height), method=how) if resize == "crop"
                  else im.resize((width, height), how))
            v = np.asarray(im, np.float32) / 127.5 - 1.0            # [H, W, 3]
    except (OSError, ValueError) as e:
        raise video_error(path, problem=f"cannot be read as an image ({e})",
                          fix="re-save it as PNG or remove it") from None
    return v.transpose(2, 0, 1)[:, None], source


def source_size(path) -> tuple[int, int]:
    """``(w, h)`` of an image (its header, PIL) or a video (ffmpeg's metadata; the frames are
    not decoded); an unreadable file is a :class:`~ditax.io.files.VideoReadError` naming it."""
    import imageio_ffmpeg
    import PIL.Image

    from ditax.io.files import video_error

    if pathlib.Path(path).suffix.lower() in IMAGE_EXT:
        try:
            with PIL.Image.open(path) as im:
                return im.size
        except (OSError, ValueError) as e:
            raise video_error(path, problem=f"cannot be read as an image ({e})",
                              fix="re-save it as PNG or remove it") from None
    try:
        gen = imageio_ffmpeg.read_frames(str(path))
        try:
            return _source_size(next(gen))
        finally:
            gen.close()
    except (OSError, RuntimeError, StopIteration, ValueError) as e:
        raise video_error(path, e) from None


def other_aspect(size, height: int, width: int) -> bool:
    """Whether a source ``(w, h)`` has another aspect ratio than ``width : height`` (then
    ``crop`` cuts some of it, ``stretch`` distorts it)."""
    w, h = size
    return w * height != h * width


def size_problems(paths, height: int, width: int, workers: int = 4) -> list[str]:
    """One line per file of ``paths`` more than :data:`TINY` times smaller than ``width x
    height`` on a side (its size and the target), read from headers only, ``workers`` at a
    time."""
    from concurrent.futures import ThreadPoolExecutor

    from ditax.io.files import VideoReadError
    from ditax.io.video import _ffmpeg_subprocess

    def one(p):
        try:
            w, h = source_size(p)
        except VideoReadError as e:
            return str(e)
        if w * TINY < width or h * TINY < height:
            return (f"{pathlib.Path(p).name} is {w}x{h} (WxH), more than {TINY}x smaller than "
                    f"the target {width}x{height} on a side (an upscale that trains on blur); "
                    f"remove it, or lower --width / --height")
        return None

    with _ffmpeg_subprocess(), ThreadPoolExecutor(max(1, workers)) as pool:
        return [r for r in pool.map(one, list(paths)) if r]


def find_samples(folder, *, height: int | None = None, width: int | None = None,
                 frames: int | None = None) -> list[tuple[pathlib.Path, str]]:
    """``(video path, caption)`` pairs; a video without a caption, an empty video file, an
    unreadable caption or ``captions.jsonl`` line, clips whose reference-image counts differ,
    a mask video with a non-binary frame (of the first ``frames``;
    :func:`~ditax.train.clip_files.sidecar_problems`) and, given ``height`` and ``width``, a
    file more than :data:`TINY` times smaller than them on a side (:func:`size_problems`) are
    listed, each with its file, in one :class:`~ditax.errors.RequestError` (or
    :class:`~ditax.io.files.UnreadableFile`) — all before any encoding."""
    folder = pathlib.Path(folder)
    out, problems = list_samples(folder)
    if height is not None and width is not None:
        problems += size_problems([v for v, _ in out], height, width)
    problems += sidecar_problems([v for v, _ in out], frames)
    return checked_samples(folder, out, problems)


def list_samples(folder) -> tuple[list[tuple[pathlib.Path, str]], list[str]]:
    """The cheap half of :func:`find_samples` (no file decoded): ``(video path, caption)``
    pairs sorted by file name, and the problems found — a clip without a caption, an empty
    file, a blank caption, a ``captions.jsonl`` line for a file not there — each naming its
    file. A folder that is missing or a file, and an unreadable caption, raise at once."""
    from ditax.errors import RequestError
    from ditax.io.files import read_json_lines, read_text, video_error

    folder = pathlib.Path(folder)
    if folder.exists() and not folder.is_dir():
        raise RequestError(f"videos folder {str(folder)!r} is a file; give the folder that "
                           f"holds the videos and their captions")
    if not folder.is_dir():
        raise FileNotFoundError(f"videos folder {str(folder)!r} does not exist")
    table, lines, problems = {}, {}, []      # every problem, each with its file, in one pass
    cj = folder / "captions.jsonl"
    if cj.exists():
        fix = 'each line is {"file": "name.mp4", "caption": "..."}'
        for n, row in read_json_lines(cj, what="captions file", fix=fix):
            if not (isinstance(row, dict) and isinstance(row.get("file"), str)
                    and isinstance(row.get("caption"), str)):
                raise RequestError(f"{cj}: line {n}: needs string entries \"file\" and "
                                   f"\"caption\"; {fix}")
            table[row["file"]], lines[row["file"]] = row["caption"], n
    out, missing = [], []
    for v in sorted(p for p in folder.iterdir() if p.suffix.lower() in VIDEO_EXT + IMAGE_EXT
                    and sidecar_kind(p) is None):
        if not v.is_file() or v.stat().st_size == 0:      # cheap to see before any model loads
            problems.append(str(video_error(v)))
            continue
        side = v.with_suffix(".txt")
        if v.name in table:
            caption = table[v.name]
        elif side.is_file():
            caption = read_text(side, what="caption").strip()
        else:
            missing.append(v.name)
            continue
        if not caption.strip():
            problems.append(f"{v.name}: its caption is blank (a clip trained on no text)")
        out.append((v, caption))
    found = {v.name for v, _ in out}
    problems += [f"{cj.name} line {n}: {name!r} is not in the folder" for name, n in
                 lines.items() if name not in found and not (folder / name).exists()]
    if missing:
        problems.append(f"no caption for {missing[:5]}{'…' if len(missing) > 5 else ''}: add "
                        f"name.txt next to each video or a line in {cj}")
    return out, problems


def checked_samples(folder, samples, problems) -> list[tuple[pathlib.Path, str]]:
    """``samples`` when ``problems`` is empty, the folder's sidecars all belong to a clip and
    there is a sample; else the :class:`~ditax.errors.RequestError` listing the problems (the
    first ten), each with its file."""
    from ditax.errors import RequestError

    folder = pathlib.Path(folder)
    if problems:
        raise RequestError(f"{folder}: {len(problems)} problem(s) before any encoding: "
                           + "; ".join(problems[:10]) + ("; …" if len(problems) > 10 else ""))
    check_sidecars(folder, {v.stem for v, _ in samples})
    if not samples:
        raise RequestError(f"no videos or images ({', '.join(VIDEO_EXT + IMAGE_EXT)}) in "
                           f"{folder}")
    return samples


def encode_group(enc, group, *, frames, height, width, resize, text_len, pad: int = 1):
    """Encode a group of clips in one encoder call: ``group`` holds ``((path, caption),
    (video [3, F, H, W], source size))``; yields per clip ``(path, size, latents [C, F', Y, X],
    text [T, Dt], mask [T], condition)`` as float32 (uint8 mask), the condition the family's
    entries (read from the clip's sidecars at the clip's size) and its extra text outputs.
    ``pad``: the call takes at least this many clips, the last repeated and its outputs
    dropped (a bucketed run's calls all take ``--batch`` clips: one program a bucket, and a
    clip's latents do not depend on how many neighbours it has)."""
    videos = [video for _, (video, _) in group]
    captions = [caption for (_, caption), _ in group]
    more = max(0, pad - len(group))
    lats = enc.encode_video(np.stack(videos + videos[-1:] * more))
    te = enc.encode_text(captions + captions[-1:] * more, text_len)
    for i, (((path, _), (video, size)), lat) in enumerate(zip(group, lats)):
        cond = enc.encode_condition(video, **read_sidecars(
            path, enc.sidecars, frames, height, width, resize=resize))
        lat = enc.sample_latents(lat, cond)     # VACE: the reference frames first
        extra_text = {k: v[i] for k, v in te.extra.items()}   # e.g. a pooled text vector
        clash = sorted(set(cond) & set(extra_text))
        if clash:
            raise ValueError(f"the family's encoders give {clash[0]!r} both as a condition "
                             f"and as a text output; rename one")
        cond = {k: np.asarray(v, np.float32) for k, v in {**cond, **extra_text}.items()}
        yield (path, size, np.asarray(lat, np.float32), np.asarray(te.embeddings[i], np.float32),
               te.mask[i], cond)


def shapes_said(cond: dict) -> str:
    """``", condition (20, 2, 8, 8), image (257, 1280)"``: a progress line's condition shapes."""
    return "".join(f", {k} {tuple(v.shape)}" for k, v in cond.items())


def _groups(items, n: int):
    """``items`` in lists of ``n`` (the last one shorter)."""
    group = []
    for item in items:
        group.append(item)
        if len(group) == n:
            yield group
            group = []
    if group:
        yield group


DTYPES = ("float32", "bfloat16", "float16")


def _machine_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def folder_family(model) -> str:
    """The model family of pipeline folder ``model`` from its ``model_index.json``
    ``_class_name`` (``FluxPipeline`` → ``flux``); the default family (Wan) for a folder
    without one or a hub id."""
    from ditax.io.files import read_model_json
    from ditax.models.registry import DEFAULT_FAMILY, spec_for_class

    index = pathlib.Path(model) / "model_index.json"
    if not index.is_file():
        return DEFAULT_FAMILY
    cls = read_model_json(index, "model_index.json").get("_class_name")
    return spec_for_class(cls).name if isinstance(cls, str) else DEFAULT_FAMILY


def default_frames(family: str) -> int:
    """The ``--frames`` a family reads when none is given (Wan 81, Flux 1: still images)."""
    from ditax.models.base import family_class

    return family_class(family).default_frames


def request_defaults(model, family: str) -> dict:
    """``height``, ``width``, ``frames`` and ``text_len`` a preprocess of pipeline folder
    ``model`` (of model family ``family``) uses where none is given: the folder's
    ``ditax_sample.json`` (:mod:`ditax.pipelines.sample_defaults`; checked, a bad file is a
    :class:`~ditax.errors.PipelineLoadError` naming it), else the family's sample defaults
    (Wan: 480x832, 512 tokens; FLUX.1: 1024x1024, 512), frames else the family's
    (:func:`default_frames`: Wan 81, Flux 1). A hub id (no local folder): the family's."""
    from ditax.pipelines.family import pipelines_of

    pipes = pipelines_of(family)
    root = pathlib.Path(model)
    own = pipes.folder_defaults(root) if (root / "model_index.json").is_file() else {}
    d = {**pipes.sample_defaults, **own}
    return {"height": d["height"], "width": d["width"],
            "frames": own.get("num_frames", default_frames(family)),
            "text_len": d["max_sequence_length"]}


def check_request(*, height, width, frames, text_len, dtype, batch, family="wan",
                  model=None, resize="crop") -> None:
    """Raise :class:`~ditax.errors.RequestError` for sizes, dtype, resize policy
    (:data:`RESIZE`) or batch that cannot be encoded: each at least 1 and below 2**31, the
    family's latent grid (Wan: 4k+1 frames, multiples of 8; Flux: multiples of twice the
    factor of ``model``'s VAE), one decoded clip (float32) within this machine's memory."""
    from ditax.numbers import INT_LIMIT
    from ditax.errors import ConfigError, RequestError, check_choice
    from ditax.models.base import family_class

    sizes = {"--height": height, "--width": width, "--frames": frames, "--text-len": text_len,
             "--batch": batch}
    for flag, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < INT_LIMIT:
            raise RequestError(f"{flag}={v}: must be an integer from 1 to {INT_LIMIT - 1}"
                               + (" (clips per encoder call)" if flag == "--batch" else ""))
    try:
        check_choice("--dtype", dtype, DTYPES)
        check_choice("--resize", resize, RESIZE)
    except ConfigError as e:
        raise RequestError(str(e)) from None
    try:
        family_class(family).folder_latent_grid(model, frames, height, width)
    except ConfigError as e:
        raise RequestError(f"--frames / --height / --width = {frames} / {height} / {width}: "
                           f"{e}") from None
    need, have = 4 * 3 * frames * height * width * batch, _machine_bytes()
    if have and need > have:
        raise RequestError(f"--frames x --height x --width x --batch = {frames} x {height} x "
                           f"{width} x {batch}: the decoded clips alone take {need / 2**30:.1f} "
                           f"GiB, more than this machine's {have / 2**30:.1f} GiB; lower them")


def check_output(output) -> pathlib.Path:
    """``output`` as a new dataset folder: not a file, not an existing dataset or non-empty
    folder, its nearest existing parent a writable folder (so it can be created). Raises
    :class:`~ditax.errors.RequestError` naming the path and the fix."""
    from ditax.errors import RequestError
    from ditax.io.outputs import check_writable_parent

    out = pathlib.Path(output)
    if out.exists() and not out.is_dir():
        raise RequestError(f"output {str(out)!r} is a file; give a new folder for the dataset")
    if out.is_dir():
        if (out / "meta.json").exists():
            raise RequestError(f"output {str(out)!r} already holds a dataset (meta.json); "
                               f"choose a new folder, or delete it first (rm -r {out})")
        if any(out.iterdir()):
            raise RequestError(f"output {str(out)!r} is a folder that is not empty; choose a "
                               f"new folder (the dataset is written into an empty one)")
    check_writable_parent(out.absolute(), "output")
    return out


def check_model(model) -> None:
    """A local ``--model`` path is a folder (a hub id that is no local path is left to the
    loaders, which fetch it when online)."""
    from ditax.errors import ModelNotFound

    p = pathlib.Path(model)
    if p.exists() and not p.is_dir():
        raise ModelNotFound(f"--model {str(p)!r} is a file; give a pipeline folder (vae/, "
                            f"text_encoder/, tokenizer/, as diffusers' save_pretrained writes)")
    looks_like_hub_id = len(str(model).split("/")) == 2 and not str(model).startswith((".", "/"))
    if not p.exists() and not looks_like_hub_id:
        raise ModelNotFound(f"--model {str(p)!r} does not exist; give a pipeline folder (vae/, "
                            f"text_encoder/, tokenizer/) or a hub id org/name")


def preprocess(videos, output, model, *, height=None, width=None, frames=None, text_len=None,
               dtype="float32", family=None, batch=1, resize="crop", say=print) -> pathlib.Path:
    """Encode every (video, caption) of ``videos`` into a dataset at ``output`` with the
    encoders of the pipeline folder ``model`` (of model family ``family``; None: the folder's,
    :func:`folder_family`), ``batch`` clips per encoder call (small clips: 8 is ~20% faster
    on CPU than 1, same latents). ``height``, ``width``, ``frames``, ``text_len`` left at None:
    the folder's ``ditax_sample.json``, else the family's (:func:`request_defaults`).
    ``resize`` (:data:`RESIZE`): how a file of another aspect ratio meets ``width x height``
    — ``crop`` (scale to cover, keep the center) or ``stretch``; ``meta.json`` records it
    (``resize``) with the names of the clips of another aspect ratio (``other_aspect_ratio``),
    and the last line ``say`` gets counts them.

    Every argument is checked before a model loads (:func:`check_request`,
    :func:`check_output`, :func:`find_samples` with the sizes: tiny files, sidecars). The
    dataset is written into a hidden temporary folder beside ``output`` and renamed to
    ``output`` when complete, so a failure or an interrupt leaves no half-written dataset (the
    temporary folder is removed)."""
    from ditax.io.outputs import atomic_folder
    from ditax.models.base import family_class

    family = folder_family(model) if family is None else family
    given = dict(height=height, width=width, frames=frames, text_len=text_len)
    if None in given.values():
        d = request_defaults(model, family)
        height, width, frames, text_len = (d[k] if v is None else v for k, v in given.items())
    check_request(height=height, width=width, frames=frames, text_len=text_len, dtype=dtype,
                  batch=batch, family=family, model=model, resize=resize)
    out = check_output(output)
    check_model(model)
    fam = family_class(family)
    samples = find_samples(videos, height=height, width=width, frames=frames)
    target = out.absolute()
    created = [p for p in target.parents if not p.exists()]      # nearest first
    try:
        with atomic_folder(target) as tmp:
            _encode(samples, tmp, fam.load_encoders(pathlib.Path(model), dtype=dtype),
                    height=height, width=width, frames=frames, text_len=text_len, batch=batch,
                    model=model, resize=resize, say=say)
    except BaseException:
        for p in created:            # and the parent folders made for it, while still empty
            try:
                p.rmdir()
            except OSError:
                break
        raise
    return out


def _encode(samples, folder, enc, *, height, width, frames, text_len, batch, model, resize,
            say):
    """Write the dataset of ``samples`` into ``folder`` with the encoders ``enc``, each clip
    and its sidecars brought to ``width x height`` by ``resize``."""
    from ditax.train.data import DatasetWriter

    w = DatasetWriter(folder)
    clips = _read_clips([path for path, _ in samples], frames, height, width, resize=resize)
    done, reshaped = 0, []
    for group in _groups(zip(samples, clips), batch):
        for path, size, lat, text, mask, cond in encode_group(
                enc, group, frames=frames, height=height, width=width, resize=resize,
                text_len=text_len):
            if other_aspect(size, height, width):
                reshaped.append(path.name)
            w.add(lat, text, mask, **cond)
            done += 1
            say(f"[{done}/{len(samples)}] {path.name}: latents {tuple(lat.shape)}"
                f"{shapes_said(cond)}")
    null = enc.encode_text([""], text_len)       # the unconditional branch's prompt
    w.close({"height": height, "width": width, "frames": frames, "model": str(model),
             "resize": resize, "other_aspect_ratio": reshaped},
            null_text=(np.asarray(null.embeddings[0], np.float32), null.mask[0]),
            null_extra={k: v[0] for k, v in null.extra.items()})
    how = "crop (center)" if resize == "crop" else resize
    verb = "cropped" if resize == "crop" else "stretched"
    say(f"{done} samples at {width}x{height}, {frames} frame(s): resize={how}, "
        f"{len(reshaped)} of {done} files {verb} from another aspect ratio")
