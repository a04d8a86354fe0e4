"""``model.vae_dtype`` (issue 54, item 5: time a bfloat16 VAE on the chip without code
changes): a Wan config key, float32 by default (Wan's own, unchanged), given to the loader's
``vae_dtype=`` by the front door; a bfloat16 decode is within a few 1/255 of float32's; a
bad value, or the key on a family without it, is one line before anything loads."""

from __future__ import annotations

import numpy as np
import pytest

import ditax
from ditax import front
from ditax.cli import main
from ditax.errors import ConfigError

DEMO = "src/ditax/assets/demo_model"


def test_the_key_reaches_the_loader_and_its_default_is_float32():
    assert front.resolve("demo", ["model.vae_dtype=bfloat16"],
                         {"prompt": "a cat"}).load.kwargs()["vae_dtype"] == "bfloat16"
    assert "vae_dtype" not in front.resolve("demo", [], {"prompt": "a cat"}).load.kwargs()
    from ditax.models.wan.config import WanConfig

    assert WanConfig().vae_dtype == "float32"


def test_a_bfloat16_decode_is_within_a_few_levels_of_float32():
    p32 = ditax.load_pipeline(DEMO)
    p16 = ditax.load_pipeline(DEMO, vae_dtype="bfloat16")
    assert p32.vae.dtype == np.float32 and p16.vae.dtype == "bfloat16"
    x = np.random.default_rng(0).standard_normal(p32.latent_shape(32, 48, 13)).astype(
        np.float32)
    a, b = p32.decode_video(x), p16.decode_video(x)
    assert b.dtype == np.float32 and a.shape == b.shape
    diff = np.abs(a - b)          # pixels in [0, 1]; measured 0.014 max, 0.0011 mean
    assert diff.max() < 8 / 255 and diff.mean() < 1 / 255, (diff.max(), diff.mean())
    assert diff.max() > 0          # it did run in bfloat16


@pytest.mark.parametrize("model, value, match", [
    ("demo", "bf16", r"^model\.vae_dtype='bf16' is not one of float32, bfloat16, float16 \(did "
                     r"you mean 'bfloat16'\?\)$"),
    ("flux-demo", "bfloat16", r"^model\.vae_dtype is not a key of flux models"),
])
def test_a_bad_value_is_one_line_before_anything_loads(model, value, match):
    with pytest.raises(ConfigError, match=match):
        front.resolve(model, [f"model.vae_dtype={value}"], {"prompt": "a cat"})


def test_the_cli_refuses_a_bad_value_in_one_line(capsys):
    rc = main(["generate", "--model", "demo", "--prompt", "a cat", "model.vae_dtype=int8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["ditax generate: error: model.vae_dtype='int8' is not one of "
                               "float32, bfloat16, float16"], err


def test_the_library_refuses_a_bad_value_before_any_file():
    with pytest.raises(ConfigError, match=r"^vae_dtype='int8' is not one of"):
        ditax.load_pipeline("/nonexistent/folder", vae_dtype="int8")
