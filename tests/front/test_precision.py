"""``model.precision`` (f32 means f32): what every dot and convolution of a run is traced at —
``auto`` is ``highest`` for a float32 model and the platform's default otherwise — entered by
the one run context every command uses (:func:`ditax.front.run.run_context`)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import ditax
from ditax import front
from ditax.demo import model_path
from ditax.errors import ConfigError
from ditax.front.run import run_context
from ditax.models.common.fields import matmul_precision


def _wan_forward_text(precision):
    """The StableHLO of the demo transformer's forward, traced inside the run context."""
    tr = ditax.load_transformer(str(model_path()))
    c = tr.config
    x = jnp.zeros((1, c.in_channels, 1, 8, 8), jnp.float32)
    text = jnp.zeros((1, 4, c.text_dim), jnp.float32)
    with run_context(ditax.AttentionConfig(), precision=precision):
        return jax.jit(lambda x, t, e: tr(x, t, e)).lower(x, jnp.ones((1,)), text).as_text()


def _dots(text: str) -> list[str]:
    return [line for line in text.splitlines() if "stablehlo.dot_general" in line]


def test_the_precision_reaches_every_dot_of_the_forward():
    highest = _dots(_wan_forward_text("highest"))
    default = _dots(_wan_forward_text("default"))   # (the suite itself runs at "highest")
    assert len(highest) == len(default) >= 8           # attention, projections, MLPs, embeddings
    assert all("HIGHEST" in d for d in highest), [d for d in highest if "HIGHEST" not in d][:2]
    # without it only the few dots the model pins itself run at HIGHEST (its float32 table
    # lookups), the rest at the platform's default (a TPU: bfloat16 passes)
    assert sum("HIGHEST" in d for d in default) <= len(default) // 4


def test_the_precision_reaches_the_vae_convolutions():
    from flax import nnx

    from ditax.models.vae.wan import WanVAE
    from ditax.models.vae.wan.config import WanVAEConfig

    vae = WanVAE(WanVAEConfig(base_dim=8, z_dim=4, dim_mult=(1, 2), num_res_blocks=1,
                              temperal_downsample=(False,)), rngs=nnx.Rngs(0))
    z = jnp.zeros((1, 4, 1, 4, 4), jnp.float32)
    with run_context(ditax.AttentionConfig(), precision="highest"):
        text = jax.jit(lambda z: vae.decode(z, path="plain")).lower(z).as_text()
    convs = [ln for ln in text.splitlines() if re.search(r"stablehlo\.convolution|dot_general",
                                                         ln)]
    assert convs and all("HIGHEST" in ln for ln in convs), convs[:2]


@pytest.mark.parametrize("over, expect", [
    ([], "highest"),                                        # the demo is float32: f32 is f32
    (["model.dtype=bfloat16"], "default"),                  # bf16 stays as fast as it was
    (["model.precision=high"], "high"),
    (["model.dtype=bfloat16", "model.precision=highest"], "highest"),
])
def test_the_front_door_resolves_auto(over, expect):
    req = front.resolve("demo", over, {"prompt": "a cat"}, say=lambda line: None)
    assert req.load.precision == expect
    assert "precision" not in req.load.kwargs()            # a run setting, not a load argument


def test_a_bad_precision_is_one_line():
    with pytest.raises(ConfigError, match=r"model\.precision.*'max'.*highest"):
        ditax.load_config("tiny", ["model.precision=max"])


def test_auto_follows_the_compute_dtype():
    from types import SimpleNamespace as NS

    assert matmul_precision(NS(dtype="float32", precision="auto")) == "highest"
    assert matmul_precision(NS(dtype="bfloat16", precision="auto")) == "default"
    assert matmul_precision(NS(dtype="float32", precision="default")) == "default"
