"""A Wan video encoded while it decodes (issue 54, item 5): the decode hands each step's frames
to an :class:`~ditax.io.video_stream.Mp4Stream` as they are made, and

- the video the call returns is the one it returns without (the same float32 values), and
  the Wan VAE's ``decode_chunks`` joined are its ``decode``;
- the mp4 is byte for byte the one :func:`~ditax.io.video.write_mp4` writes of that video
  (same frames, same ffmpeg arguments: :func:`~ditax.io.video.mp4_args` is the one source of
  both) — the file bytes are what is asserted, the strongest check there is;
- a decode that cannot go in steps (tiles, a row split) decodes whole, puts nothing and says
  why (``whole``), never silently;
- the writer's failure (ffmpeg failing midway, a writer that raises) is raised to the
  producer, and nothing is left under the mp4's name.

The demo model's VAE on random latents: no transformer runs here."""

from __future__ import annotations

import numpy as np
import pytest

import ditax
from ditax.io.outputs import WriteFailed
from ditax.io.video import write_mp4
from ditax.io.video_stream import Mp4Stream
from ditax.pipelines.base import whole_reason
from full_disk import fake_ffmpeg

DEMO = "src/ditax/assets/demo_model"
SIZE = dict(height=32, width=48, num_frames=13)     # 4 latent frames: 1 + 3 decode steps


@pytest.fixture(scope="module")
def pipe():
    return ditax.load_pipeline(DEMO)


@pytest.fixture(scope="module")
def latents(pipe):
    shape = pipe.latent_shape(**SIZE)
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


class Sink:
    """A frames_to= that keeps what it was handed."""

    def __init__(self):
        self.parts, self.reason = [], None

    def put(self, frames):
        self.parts.append(np.array(frames))

    def whole(self, reason):
        self.reason = reason


def test_decode_chunks_joined_are_the_decode(pipe, latents):
    import jax.numpy as jnp

    z = pipe.vae.denormalize_latents(jnp.asarray(latents))
    whole = np.asarray(pipe.vae.decode(z))
    for n in (None, 2):          # the steps' length changes nothing (the causal cache)
        parts = list(pipe.vae.decode_chunks(z, frames_per_chunk=n))
        assert len(parts) > 1
        np.testing.assert_array_equal(np.concatenate([np.asarray(p) for p in parts], 2), whole)


def test_each_chunks_pixels_are_dispatched_before_the_next_step(pipe, latents):
    """The order work reaches the device in: a step, its pixels (clip, channels first),
    then the next step — a caller waiting for a chunk's pixels waits for its own step only
    (they used to be dispatched behind the next step: the device then idled through each
    chunk's host work). The programs are the real compiled ones, wrapped to log calls."""
    import jax.numpy as jnp

    from ditax.models.vae.wan import model as vae_model

    z = pipe.vae.denormalize_latents(jnp.asarray(latents))
    real = pipe.vae.compile_decode(z.shape, frames_per_chunk=1)
    log = []

    def logged(name, fn):
        def run(*a):
            log.append(name)
            return fn(*a)
        return run

    programs = real._replace(first=logged("step", real.first), rest=logged("step", real.rest))
    pixels = vae_model.video_pixels
    try:
        vae_model.video_pixels = lambda v, p: (log.append("pixels"), pixels(v, p))[1]
        got = [np.asarray(c) for c in pipe.vae.decode_chunks(z, programs=programs)]
    finally:
        vae_model.video_pixels = pixels
    assert log == ["step", "pixels"] * 4, log
    np.testing.assert_array_equal(np.concatenate(got, 2), np.asarray(pipe.vae.decode(z)))


def test_the_frames_handed_over_are_the_video_and_its_mp4_the_same_bytes(pipe, latents,
                                                                           tmp_path):
    want = pipe.decode_video(latents)
    sink = Sink()
    got = pipe.decode_video(latents, frames_to=sink)
    assert got.dtype == np.float32 and sink.reason is None and len(sink.parts) == 4
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.concatenate(sink.parts), want)
    with Mp4Stream(tmp_path / "s.mp4", fps=16) as stream:
        got = pipe.decode_video(latents, frames_to=stream)
        assert stream.used and stream.frames == len(want)
        write_mp4(tmp_path / "s.mp4", got, fps=16, encoded=stream)
    write_mp4(tmp_path / "w.mp4", want, fps=16)
    assert (tmp_path / "s.mp4").read_bytes() == (tmp_path / "w.mp4").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.mp4", "w.mp4"]


def test_a_tiled_decode_runs_whole_and_says_why(pipe):
    size = dict(height=16, width=288, num_frames=5)      # two 256-pixel tiles
    x = np.random.default_rng(1).standard_normal(pipe.latent_shape(**size)).astype(np.float32)
    sink = Sink()
    got = pipe.decode_video(x, frames_to=sink, tiled=True)
    assert sink.parts == [] and sink.reason.startswith("the decode runs in spatial tiles")
    np.testing.assert_array_equal(got, pipe.decode_video(x, tiled=True))


def test_whole_reasons(pipe):
    assert whole_reason(pipe.vae, None, {"tiled": False}) is None
    assert "rows are split over the mesh" in whole_reason(pipe.vae, object(), {})
    assert whole_reason(object(), None, {}) == "object decodes the video whole"


def test_ffmpeg_failing_midway_is_raised_and_leaves_nothing(pipe, latents, tmp_path,
                                                            monkeypatch):
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", fake_ffmpeg(tmp_path, "midway"))
    out = tmp_path / "out"
    with pytest.raises(WriteFailed, match=r"could not write .*v\.mp4: no space left on device"):
        with Mp4Stream(out / "v.mp4") as stream:
            video = pipe.decode_video(latents, frames_to=stream)
            write_mp4(out / "v.mp4", video, encoded=stream)
    assert list(out.iterdir()) == []


def test_a_writer_that_raises_stops_the_decode(pipe, latents, tmp_path, monkeypatch):
    import time

    from ditax.io import ffmpeg

    def broken(args, target, chunks):
        next(iter(chunks))
        raise RuntimeError("the encoder broke")

    monkeypatch.setattr(ffmpeg, "write", broken)
    with pytest.raises(RuntimeError, match="the encoder broke"):
        with Mp4Stream(tmp_path / "v.mp4") as stream:
            stream.put(np.zeros((1, 8, 8, 3), np.float32))
            while stream.ended is None:
                time.sleep(0.01)
            pipe.decode_video(latents, frames_to=stream)     # its first put raises
    assert list(tmp_path.iterdir()) == []


def test_a_stream_checks_what_it_is_given(tmp_path):
    with Mp4Stream(tmp_path / "v.mp4") as stream:
        with pytest.raises(ValueError, match="even height and width; got 7x8"):
            stream.put(np.zeros((1, 7, 8, 3), np.uint8))
        stream.put(np.zeros((2, 8, 8, 3), np.uint8))
        with pytest.raises(ValueError, match=r"frames of \(8, 10, 3\) after frames of"):
            stream.put(np.zeros((1, 8, 10, 3), np.uint8))
        with pytest.raises(RuntimeError, match="2 frames were encoded, the video has 3"):
            write_mp4(tmp_path / "v.mp4", np.zeros((3, 8, 8, 3), np.uint8), encoded=stream)
    assert list(tmp_path.iterdir()) == []
