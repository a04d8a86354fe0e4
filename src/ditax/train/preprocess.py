"""``ditax preprocess VIDEOS OUT --model PIPELINE``: videos + captions → latent dataset.

Each video in ``VIDEOS`` (``.mp4 .mov .webm .mkv .avi``) needs a caption: a sidecar
``name.txt`` or a line ``{"file": "name.mp4", "caption": "..."}`` in ``VIDEOS/captions.jsonl``.
Frames are read with ffmpeg (imageio-ffmpeg), scaled to ``--width × --height``, the first
``--frames`` (4k+1) kept; the pipeline's Wan VAE encodes them (posterior mean, normalised with
the VAE's latents mean/std — the space the transformer is trained in) and its UMT5 encodes the
caption padded to ``--text-len`` tokens (zeros past the prompt, mask saved). The result is the
ArrayRecord dataset of :mod:`ditax.train.data`.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

VIDEO_EXT = (".mp4", ".mov", ".webm", ".mkv", ".avi")


def read_video(path, num_frames: int, height: int, width: int) -> np.ndarray:
    """First ``num_frames`` frames scaled to ``height × width``: float32 ``[3, F, H, W]`` in [-1, 1]."""
    import imageio_ffmpeg

    from ditax.io.video import _ffmpeg_subprocess

    gen = imageio_ffmpeg.read_frames(str(path), output_params=["-vf", f"scale={width}:{height}"])
    with _ffmpeg_subprocess():
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


def preprocess(videos, output, model, *, height=480, width=832, frames=81, text_len=512,
               dtype="float32", say=print) -> pathlib.Path:
    """Encode every (video, caption) of ``videos`` into a dataset at ``output``."""
    import jax.numpy as jnp

    from ditax.models.tokenizer import load_tokenizer
    from ditax.models.umt5 import encode_prompt, load_text_encoder
    from ditax.models.wan.vae.config import WanVAEConfig
    from ditax.models.wan.vae_convert import load_vae
    from ditax.train.data import DatasetWriter

    samples = find_samples(videos)
    tf = WanVAEConfig().temporal_factor  # checked before the VAE loads; its encode checks again
    if (frames - 1) % tf:
        raise ValueError(f"--frames={frames} must be {tf}k+1 (e.g. 81)")
    model = pathlib.Path(model)
    vae = load_vae(model / "vae" if (model / "vae").is_dir() else model, dtype=dtype)
    enc = load_text_encoder(model, dtype=dtype)
    tok = load_tokenizer(model)
    w = DatasetWriter(output)
    for i, (path, caption) in enumerate(samples):
        video = jnp.asarray(read_video(path, frames, height, width))[None]
        lat = vae.normalize_latents(vae.encode(video.astype(dtype)))[0]
        _, mask = tok.encode([caption], text_len)
        text = encode_prompt(tok, enc, [caption], text_len)[0]
        w.add(np.asarray(lat, np.float32), np.asarray(text, np.float32), mask[0])
        say(f"[{i + 1}/{len(samples)}] {path.name}: latents {tuple(lat.shape)}")
    return w.close({"height": height, "width": width, "frames": frames, "model": str(model)})
