"""Step caching with an image condition (the pipelines' ``cond`` pytree goes into the cached
step as into the plain one): on tiny random Wan 2.1 I2V (channels + CLIP tokens) and Wan 2.2
TI2V (first-frame blend, per-token timesteps) pipelines, a threshold of 0 never skips and gives
the uncached video, a large one skips steps (counted) and stays close, CFG reuse replaces the
unconditional branch, and ``calibrate`` measures an image-conditioned model's numbers."""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.pipelines.cache.numbers import match_of, write_numbers  # noqa: E402
from ditax.pipelines.cache.calibrate import calibrate  # noqa: E402
from compiles import compiles  # noqa: E402
from i2v_reference import PROMPT, SIZE21, SIZE22, image, make_tiny_i2v  # noqa: E402

N = 6
CACHED = "cached_denoise_step"
SIZES = {"i2v": SIZE21, "ti2v": SIZE22}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``kind -> (pipeline, request kwargs, uncached video)``, each built once."""
    cache = {}

    def get(kind):
        if kind not in cache:
            _, folder = make_tiny_i2v(tmp_path_factory.mktemp(kind), kind)
            pipe = ditax.load_pipeline(folder)
            pipe.compile_cache = "none"
            size = SIZES[kind]
            lat = np.random.default_rng(1).standard_normal(
                pipe.latent_shape(size["height"], size["width"], size["num_frames"]))
            kw = dict(PROMPT, **size, latents=lat.astype(np.float32), num_inference_steps=N,
                      guidance_scale=5.0, progress=False,
                      image=image(1, size["height"], size["width"]))
            cache[kind] = pipe, kw, pipe(**kw)
        return cache[kind]
    return get


def _check_skips(pipe, got, base):
    st = pipe.last_stats
    skipped = st["skipped_steps"]
    assert skipped["cond"] and 0 not in skipped["cond"]     # the first step always runs
    assert st["transformer_calls"] == 2 * N - len(skipped["cond"]) - len(skipped["uncond"])
    diff = np.abs(got - base).max()
    assert 0 < diff < 0.1, diff      # steps really skipped, the video still close


def test_i2v_first_block_and_magcache(built, tmp_path):
    pipe, kw, base = built("i2v")
    assert pipe.transformer.config.image_dim is not None     # CLIP tokens in cross-attention
    with compiles() as log:
        never = pipe(cache="first_block", cache_threshold=0.0, **kw)
    assert log.count(CACHED) <= 1, log.names
    assert pipe.last_stats["transformer_calls"] == 2 * N
    assert np.abs(never - base).max() <= 1e-6
    with compiles() as again:
        some = pipe(cache="first_block", cache_threshold=10.0, **kw)
    assert again.count(CACHED) == 0, again.names               # same program, other threshold
    _check_skips(pipe, some, base)
    # magcache with flat ratios (|1 - 1| = 0 error: every step may skip, K in a row at most)
    numbers = write_numbers(tmp_path / "n.json", {
        "name": "tiny-i2v", "match": match_of(pipe.transformer.config), "experts": 1,
        "magcache": {"ratios": [[1.0] * N, [1.0] * N], "retention_ratio": 0.2,
                     "max_skip_steps": 2}})
    never = pipe(cache="magcache", cache_threshold=0.0, cache_coefficients=numbers, **kw)
    assert pipe.last_stats["transformer_calls"] == 2 * N
    assert np.abs(never - base).max() <= 1e-6
    some = pipe(cache="magcache", cache_threshold=10.0, cache_coefficients=numbers, **kw)
    _check_skips(pipe, some, base)
    assert pipe.last_stats["skipped_steps"]["cond"] == [1, 2, 4, 5]   # K = 2 in a row


def test_i2v_cfg_cache(built):
    pipe, kw, base = built("i2v")
    got = pipe(cfg_cache=True, **kw)
    st = pipe.last_stats
    assert st["cfg_reused_steps"], st
    assert st["transformer_calls"] == 2 * N - len(st["cfg_reused_steps"])
    assert 0 < np.abs(got - base).max() < 0.1


def test_ti2v_calibrated_teacache(built, tmp_path):
    """Per-token timesteps: TeaCache compares the per-token modulation [B, L, 6, D]."""
    pipe, kw, base = built("ti2v")
    assert pipe.expand_timesteps
    req = {k: kw[k] for k in ("negative_prompt", "height", "width", "num_frames",
                              "num_inference_steps", "guidance_scale", "image")}
    entry = calibrate(pipe, ["a cat walks on the grass", "a red car"], name="tiny-ti2v", **req)
    assert entry["source"].endswith("with an image")
    x = np.asarray(entry["measured"]["teacache_input_change"])
    assert np.isfinite(x).all() and (x > 0).all()
    path = write_numbers(tmp_path / "numbers.json", entry)
    never = pipe(cache="teacache", cache_threshold=0.0, cache_coefficients=path, **kw)
    assert pipe.last_stats["transformer_calls"] == 2 * N
    assert np.abs(never - base).max() <= 1e-6
    some = pipe(cache="teacache", cache_threshold=100.0, cache_coefficients=path, **kw)
    _check_skips(pipe, some, base)

