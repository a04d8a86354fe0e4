"""A Wan pipeline's decode under a device's memory budget (:mod:`ditax.pipelines.decode_fit`),
with the budget injected (CPUs are not planned): over it, the decode runs in spatial tiles and
says so in one line; within it, whole; fitting neither, one line before any work; a
``vae_tiling`` the caller set wins. The demo model's VAE (4x spatial: 256-pixel tiles are 64
latent pixels) at 16x288 pixels has two tiles."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import ditax
from ditax import front
from ditax.errors import RequestError
from ditax.pipelines import decode_fit

DEMO = "src/ditax/assets/demo_model"
SIZE = dict(height=16, width=288, num_frames=5)
LINE = "decoding in spatial tiles"


@pytest.fixture(scope="module")
def pipe():
    return ditax.load_pipeline(DEMO)


@pytest.fixture(scope="module")
def fit(pipe):
    return pipe.vae.plan_decode(pipe.latent_shape(**SIZE), budget=2**40, tiles=True)


def _budget(monkeypatch, n):
    monkeypatch.setattr(decode_fit, "device_budget", lambda device: n)


def _latents(pipe):
    shape = pipe.latent_shape(**SIZE)
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_over_the_budget_the_decode_runs_in_tiles_and_says_so(pipe, fit, monkeypatch, caplog):
    assert fit.tiled < fit.whole
    _budget(monkeypatch, (fit.tiled + fit.whole) // 2)
    x = _latents(pipe)
    with caplog.at_level(logging.WARNING, logger=decode_fit.__name__):
        got = pipe.decode_video(x)
    lines = [r.getMessage() for r in caplog.records if LINE in r.getMessage()]
    assert len(lines) == 1 and len(lines[0].splitlines()) == 1, caplog.text
    assert lines[0].startswith("VAE decode: 16x288x5 float32 needs ~")
    assert "sample.vae_tiling=true" in lines[0]
    want = pipe.decode_video(x, tiled=True)            # what tiles asked for decode
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - pipe.decode_video(x, tiled=False)).max() > 0   # it did tile


def test_within_the_budget_or_on_a_cpu_the_decode_is_whole(pipe, fit, monkeypatch, caplog):
    shape = pipe.latent_shape(**SIZE)
    assert pipe.decode_options(shape) == {"tiled": False}       # a CPU: not planned
    _budget(monkeypatch, fit.whole)
    with caplog.at_level(logging.WARNING, logger=decode_fit.__name__):
        assert pipe.decode_options(shape) == {"tiled": False}
    assert LINE not in caplog.text


@pytest.mark.parametrize("tiling", [False, True])
def test_a_tiling_the_caller_set_wins(pipe, monkeypatch, caplog, tiling):
    _budget(monkeypatch, 1)       # nothing would fit
    monkeypatch.setattr(pipe, "vae_tiling", tiling)
    with caplog.at_level(logging.WARNING, logger=decode_fit.__name__):
        assert pipe.decode_options(pipe.latent_shape(**SIZE)) == {"tiled": tiling}
    assert LINE not in caplog.text


def test_a_decode_that_fits_nowhere_is_refused_before_any_work(pipe, fit, monkeypatch):
    _budget(monkeypatch, fit.tiled - 1)

    def encode_text(*args, **kw):
        raise AssertionError("the prompt was encoded before the decode was planned")

    monkeypatch.setattr(pipe, "encode_text", encode_text)
    with pytest.raises(RequestError) as e:
        pipe("a red ball", num_inference_steps=1, progress=False, **SIZE)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("VAE decode: 16x288x5 float32 needs")
    assert "in spatial tiles, over the" in msg and "lower --height" in msg


def test_the_call_plans_once_and_tiles(pipe, fit, monkeypatch, caplog):
    """A whole call over the budget: one line, and the frames the tiled decode of its latents
    gives (the call's own latents, decoded again with tiles asked for)."""
    _budget(monkeypatch, (fit.tiled + fit.whole) // 2)
    call = dict(SIZE, num_inference_steps=1, seed=3, progress=False)
    with caplog.at_level(logging.WARNING, logger=decode_fit.__name__):
        video = pipe("a red ball", **call)
    assert sum(LINE in r.getMessage() for r in caplog.records) == 1
    latents = pipe("a red ball", output="latent", **call)
    np.testing.assert_array_equal(video, pipe.decode_video(latents, tiled=True))


@pytest.mark.parametrize("overrides, want", [([], None), (["sample.vae_tiling=false"], False),
                                             (["sample.vae_tiling=true"], True)])
def test_the_front_door_tells_unset_from_false(overrides, want):
    load = front.resolve("demo", overrides, {"prompt": "a cat"}).load
    assert load.vae_tiling is want
    assert load.kwargs().get("vae_tiling", "unset") == ("unset" if want is None else want)


def test_a_streamed_decode_that_cannot_fit_is_refused_before_any_work(pipe, monkeypatch):
    """A causal stream decodes each piece whole (no tiles): its pieces of 2 latent frames
    over the budget are one line before the prompt is encoded; within it, nothing is said."""
    from ditax.pipelines.wan.causal import stream

    size = dict(SIZE, num_frames=9)     # 3 latent frames: the first, then a piece of 2
    fit = pipe.vae.plan_decode((1, pipe.vae.z_dim, 3, 4, 72), budget=2**40)
    need = fit.chunk_bytes(2)
    assert need > fit.whole

    def encode_text(*args, **kw):
        raise AssertionError("the prompt was encoded before the decode was planned")

    monkeypatch.setattr(pipe, "encode_text", encode_text)
    _budget(monkeypatch, need - 1)
    with pytest.raises(RequestError) as e:
        next(stream(pipe, "a red ball", chunk=2, num_inference_steps=1, **size))
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert msg.startswith("VAE decode: a streamed chunk of 2 latent frames at 16x288 float32")
    _budget(monkeypatch, need)
    with pytest.raises(AssertionError, match="the prompt was encoded"):   # planned, went on
        next(stream(pipe, "a red ball", chunk=2, num_inference_steps=1, **size))
