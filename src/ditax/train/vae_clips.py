"""The clips (or still images) a VAE trains on, in memory: every clip of a folder as uint8
(:class:`ClipBank`; the last ``data.eval_clips`` held out for the PSNR) and each step's batch
of random windows (``data.crop_frames`` frames, ``data.crop`` pixels square; foreground
oversampled with ``data.crop_focus``), a pure function of ``(seed, step)`` so that a resumed run
draws the same batches.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np

from ditax.train.clip_files import IMAGE_EXT, VIDEO_EXT, sidecar_kind


class ClipError(ValueError):
    """The clip folder cannot feed VAE training; the message names the folder and the fix."""


def list_videos(folder) -> list[pathlib.Path]:
    """The videos and still images of ``folder``, sorted by name; a VACE clip's sidecars
    (``NAME.mask.mp4``, ``NAME.control.mp4``, ``NAME.ref.png``: :mod:`ditax.train.clip_files`)
    are not clips, as for ``ditax preprocess``."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise ClipError(f"data.source={str(folder)!r} is not a folder of clips; write one with "
                        "`python -m ditax.synthetic` or point data.source at your videos")
    ext = VIDEO_EXT + IMAGE_EXT
    videos = sorted(p for p in folder.iterdir()
                    if p.suffix.lower() in ext and sidecar_kind(p) is None)
    if not videos:
        raise ClipError(f"data.source={str(folder)!r} holds no videos or images "
                        f"({', '.join(ext)})")
    return videos


class ClipBank:
    """Every clip of a folder as uint8 ``[N, F, H, W, 3]`` in memory (an image: ``F = 1``);
    the last ``eval_clips`` (sorted by file name) are held out."""

    def __init__(self, data, say=print):
        from ditax.train.preprocess import read_videos

        videos = list_videos(data.source)
        if data.max_clips:
            videos = videos[:data.max_clips]
        if len(videos) <= data.eval_clips:
            raise ClipError(f"data.source={data.source!r} has {len(videos)} clips; with "
                            f"data.eval_clips={data.eval_clips} held out none is left to train "
                            "on; add clips or lower data.eval_clips")
        clips = np.empty((len(videos), data.num_frames, data.height, data.width, 3), np.uint8)
        t0 = time.perf_counter()
        for i, x in enumerate(read_videos(videos, data.num_frames, data.height, data.width)):
            # x: [3, F, H, W] in [-1, 1]
            clips[i] = np.round((x.transpose(1, 2, 3, 0) + 1.0) * 127.5).clip(0, 255)
        say(f"train-vae: read {len(videos)} clips ({data.num_frames}x{data.height}x"
            f"{data.width}) from {data.source} in {time.perf_counter() - t0:.1f} s")
        self.train = clips[:-data.eval_clips]
        self.eval = clips[-data.eval_clips:]
        self.data = data

    def batch(self, seed: int, step: int, batch_size: int) -> np.ndarray:
        """Step ``step``'s batch: float32 ``[B, crop_frames, c, c, 3]`` in [-1, 1]."""
        d = self.data
        rng = np.random.default_rng([seed, step, 0xAE])
        idx = rng.integers(len(self.train), size=batch_size)
        f0 = rng.integers(d.num_frames - d.crop_frames + 1, size=batch_size)
        ch, cw = (d.crop, d.crop) if d.crop else (d.height, d.width)
        y0 = rng.integers(d.height - ch + 1, size=batch_size)
        x0 = rng.integers(d.width - cw + 1, size=batch_size)
        if d.crop_focus:
            y0, x0 = self._focus(rng, idx, f0, y0, x0)
        out = np.stack([self.train[i, f:f + d.crop_frames, y:y + ch, x:x + cw]
                        for i, f, y, x in zip(idx, f0, y0, x0)])
        return out.astype(np.float32) / 127.5 - 1.0

    def _focus(self, rng, idx, f0, y0, x0):
        """Foreground oversampling: with probability ``crop_focus`` a sample's square becomes
        the one of largest pixel standard deviation among its drawn square and
        ``crop_candidates - 1`` more random ones (the same window of frames)."""
        d = self.data
        n, k, c = len(idx), d.crop_candidates, d.crop
        focus = rng.random(n) < d.crop_focus
        ys = np.concatenate([y0[:, None], rng.integers(d.height - c + 1, size=(n, k - 1))], 1)
        xs = np.concatenate([x0[:, None], rng.integers(d.width - c + 1, size=(n, k - 1))], 1)
        y0, x0 = y0.copy(), x0.copy()
        for b in np.flatnonzero(focus):
            window = self.train[idx[b], f0[b]:f0[b] + d.crop_frames]
            spread = [window[:, y:y + c, x:x + c].std() for y, x in zip(ys[b], xs[b])]
            j = int(np.argmax(spread))
            y0[b], x0[b] = ys[b, j], xs[b, j]
        return y0, x0


__all__ = ["ClipBank", "ClipError", "list_videos"]
