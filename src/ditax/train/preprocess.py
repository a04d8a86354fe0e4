"""``ditax preprocess VIDEOS OUT --model PIPELINE``: videos + captions → latent dataset.

Each video in ``VIDEOS`` (``.mp4 .mov .webm .mkv .avi``) needs a caption: a sidecar
``name.txt`` or a line ``{"file": "name.mp4", "caption": "..."}`` in ``VIDEOS/captions.jsonl``.
Frames are read with ffmpeg (imageio-ffmpeg), scaled to ``--width × --height``, the first
``--frames`` (Wan: 4k+1) kept; the model family's encoders (Wan: the pipeline's VAE, posterior
mean normalised with the VAE's latents mean/std — the space the transformer is trained in —
and its UMT5, captions padded to ``--text-len`` tokens, zeros past the prompt, mask saved)
turn them into training samples. An image-to-video folder (Wan I2V) also stores each clip's
first-frame condition: mask + condition latents, and for Wan 2.1 the CLIP features of the
first frame (:meth:`~ditax.models.wan.family.WanEncoders.encode_condition`); Wan 2.2 TI2V
needs nothing extra (its condition is the clip's first latent frame). The result is the
ArrayRecord dataset of :mod:`ditax.train.data`.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

VIDEO_EXT = (".mp4", ".mov", ".webm", ".mkv", ".avi")


def read_video(path, num_frames: int, height: int, width: int) -> np.ndarray:
    """First ``num_frames`` frames scaled to ``height × width``: float32 ``[3, F, H, W]`` in [-1, 1]."""
    from ditax.io.video import _ffmpeg_subprocess

    with _ffmpeg_subprocess():
        return _decode(path, num_frames, height, width)


def read_videos(paths, num_frames: int, height: int, width: int, *, workers: int = 4,
                ahead: int = 16):
    """:func:`read_video` of every path, in order, decoded ``workers`` at a time (each by its
    own ffmpeg process, so they overlap with the caller's work); at most ``ahead`` decoded
    clips wait in memory."""
    import collections
    from concurrent.futures import ThreadPoolExecutor

    from ditax.io.video import _ffmpeg_subprocess

    paths = list(paths)
    # the warning filter is process-wide: set once here, not per thread (catch_warnings is not
    # thread-safe)
    with _ffmpeg_subprocess(), ThreadPoolExecutor(max(1, workers)) as pool:
        pending = collections.deque()
        for p in paths:
            pending.append(pool.submit(_decode, p, num_frames, height, width))
            if len(pending) >= max(1, ahead):
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _decode(path, num_frames: int, height: int, width: int) -> np.ndarray:
    import imageio_ffmpeg

    gen = imageio_ffmpeg.read_frames(str(path), output_params=["-vf", f"scale={width}:{height}"])
    next(gen)  # metadata (starts ffmpeg)
    frames = []
    for raw in gen:
        frames.append(np.frombuffer(raw, np.uint8).reshape(height, width, 3))
        if len(frames) == num_frames:
            break
    gen.close()
    if len(frames) < num_frames:
        raise ValueError(f"{path}: has {len(frames)} frames, fewer than --frames={num_frames}")
    v = np.stack(frames).astype(np.float32) / 127.5 - 1.0      # [F, H, W, 3]
    return v.transpose(3, 0, 1, 2)


def find_samples(folder) -> list[tuple[pathlib.Path, str]]:
    """``(video path, caption)`` pairs; a video without a caption is an error naming it."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"videos folder {str(folder)!r} does not exist")
    table = {}
    cj = folder / "captions.jsonl"
    if cj.is_file():
        for line in cj.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                table[row["file"]] = row["caption"]
    out, missing = [], []
    for v in sorted(p for p in folder.iterdir() if p.suffix.lower() in VIDEO_EXT):
        side = v.with_suffix(".txt")
        if v.name in table:
            out.append((v, table[v.name]))
        elif side.is_file():
            out.append((v, side.read_text().strip()))
        else:
            missing.append(v.name)
    if missing:
        raise ValueError(f"no caption for {missing[:5]}{'…' if len(missing) > 5 else ''}: add "
                         f"name.txt next to each video or a line in {cj}")
    if not out:
        raise ValueError(f"no videos ({', '.join(VIDEO_EXT)}) in {folder}")
    return out


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


def preprocess(videos, output, model, *, height=480, width=832, frames=81, text_len=512,
               dtype="float32", family="wan", batch=1, say=print) -> pathlib.Path:
    """Encode every (video, caption) of ``videos`` into a dataset at ``output`` with the
    encoders of the pipeline folder ``model`` (of model family ``family``), ``batch`` clips
    per encoder call (small clips: 8 is ~20% faster on CPU than 1, same latents)."""
    from ditax.errors import ConfigError
    from ditax.models.base import family_class
    from ditax.train.data import DatasetWriter

    if batch < 1:
        raise ValueError(f"batch={batch}: clips per encoder call must be at least 1")
    fam = family_class(family)
    samples = find_samples(videos)
    try:
        fam.latent_grid(frames, height, width)
    except ConfigError as e:
        raise ValueError(f"--frames / --height / --width = {frames} / {height} / {width}: "
                         f"{e}") from None
    model = pathlib.Path(model)
    enc = fam.load_encoders(model, dtype=dtype)
    w = DatasetWriter(output)
    encode_condition = getattr(enc, "encode_condition", None)
    videos = read_videos([path for path, _ in samples], frames, height, width)
    done = 0
    for group in _groups(zip(samples, videos), batch):
        lats = enc.encode_video(np.stack([video for _, video in group]))
        texts, masks = enc.encode_text([caption for (_, caption), _ in group], text_len)
        for ((path, _), video), lat, text, mask in zip(group, lats, texts, masks):
            cond = {} if encode_condition is None else encode_condition(video)
            w.add(np.asarray(lat, np.float32), np.asarray(text, np.float32), mask,
                  **{k: np.asarray(v, np.float32) for k, v in cond.items()})
            extra = "".join(f", {k} {tuple(v.shape)}" for k, v in cond.items())
            done += 1
            say(f"[{done}/{len(samples)}] {path.name}: latents {tuple(lat.shape)}{extra}")
    text, mask = enc.encode_text([""], text_len)       # the unconditional branch's prompt
    return w.close({"height": height, "width": width, "frames": frames, "model": str(model)},
                   null_text=(np.asarray(text[0], np.float32), mask[0]))
