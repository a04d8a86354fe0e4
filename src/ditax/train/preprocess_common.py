"""The shared floor of ``ditax preprocess`` (:mod:`ditax.train.preprocess`): the clip list and
its one pre-pass of problems, the request's checks (sizes on the family's latent grid, dtype,
resize policy, memory), the output and model checks, and one encoder call over a group of
clips. The single-shape run, the bucketed run (:mod:`ditax.train.preprocess_buckets`) and the
parts of a run over several processes (:mod:`ditax.train.preprocess_parts`) all build on it,
so none of them imports another's module for these."""

from __future__ import annotations

import os
import pathlib

import numpy as np

from ditax.train.clip_files import (IMAGE_EXT, VIDEO_EXT, check_sidecars, sidecar_kind,
                                    sidecar_problems)
from ditax.train.clip_reading import (RESIZE, TINY, read_sidecars,  # noqa: F401  (TINY: docs)
                                      size_problems)

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
    entries (read from the clip's sidecars at the clip's size; the clip's path too for
    encoders that read it, :attr:`~ditax.models.base.Encoders.reads_clip`) and its extra text
    outputs. A clip the encoders refuse (:class:`~ditax.models.base.SkipClip`) yields
    ``(path, size, None, None, None, why)``: the caller says ``why`` and leaves it out.
    ``pad``: the call takes at least this many clips, the last repeated and its outputs
    dropped (a bucketed run's calls all take ``--batch`` clips: one program a bucket, and a
    clip's latents do not depend on how many neighbours it has)."""
    from ditax.models.base import SkipClip

    videos = [video for _, (video, _) in group]
    captions = [caption for (_, caption), _ in group]
    more = max(0, pad - len(group))
    lats = enc.encode_video(np.stack(videos + videos[-1:] * more))
    te = enc.encode_text(captions + captions[-1:] * more, text_len)
    for i, (((path, _), (video, size)), lat) in enumerate(zip(group, lats)):
        sidecars = read_sidecars(path, enc.sidecars, frames, height, width, resize=resize)
        if enc.reads_clip:
            sidecars["clip"] = path
        try:
            cond = enc.encode_condition(video, **sidecars)
        except SkipClip as e:
            yield path, size, None, None, None, str(e)
            continue
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


__all__ = ["find_samples", "list_samples", "checked_samples", "encode_group", "shapes_said",
           "DTYPES", "folder_family", "default_frames", "request_defaults", "check_request",
           "check_output", "check_model"]
