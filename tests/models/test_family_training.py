"""A second model family plugs into training without touching ``ditax.train``: a toy denoiser
defined here (built from the shared ``ditax.nn`` layers) is registered as family ``toy`` and
trained through :func:`ditax.train.loop.train` on synthetic data; its loss goes down."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.config import ConfigError, load_config
from ditax.models.base import model_family, register_family
from family_scope import families_restored
from toy_family import ToyFamilyBase
from ditax.nn import Linear, TimestepEmbedding, timestep_embedding
from ditax.train.loop import train

pytestmark = pytest.mark.usefixtures("fast_compile")


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    family: str = "toy"
    channels: int = 4
    text_dim: int = 8
    width: int = 32
    freq_dim: int = 16


class ToyDenoiser(nnx.Module):
    """Per-token MLP over the latent channels, modulated by the timestep and the mean text."""

    def __init__(self, cfg: ToyConfig, rngs: nnx.Rngs):
        kw = dict(dtype="float32", param_dtype="float32", rngs=rngs)
        self.freq_dim = cfg.freq_dim
        self.proj_in = Linear(cfg.channels, cfg.width, **kw)
        self.time = TimestepEmbedding(cfg.freq_dim, cfg.width, **kw)
        self.text = Linear(cfg.text_dim, cfg.width, **kw)
        self.proj_out = Linear(cfg.width, cfg.channels, **kw)

    def __call__(self, latents, timestep, text, text_mask):
        x = jnp.moveaxis(latents, 1, -1)                                   # [B, F, Y, X, C]
        m = text_mask[..., None].astype(text.dtype)
        ctx = (text * m).sum(1) / jnp.maximum(m.sum(1), 1.0)               # [B, Dt]
        cond = self.time(timestep_embedding(timestep, self.freq_dim)) + self.text(ctx)
        h = jax.nn.gelu(self.proj_in(x) * (1.0 + cond[:, None, None, None]))
        return jnp.moveaxis(self.proj_out(h), -1, 1)                       # [B, C, F, Y, X]


class ToyFamily(ToyFamilyBase):
    name = "toy"

    def flops_per_sample(self, latent_shape, text_len):
        return 6.0 * self.tokens_per_sample(latent_shape) * self.model.channels * self.model.width

    def create(self, mesh, rngs):
        return ToyDenoiser(self.model, rngs)


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    """The toy family, registered for this module's tests (and gone after them)."""
    with families_restored():
        register_family(ToyFamily)
        yield


def test_unknown_family_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model.family='nope' is not a known model family; "
                                          r"use one of .*wan"):
        model_family(ToyConfig(family="nope"))
    assert model_family(load_config("tiny").model).name == "wan"


def test_toy_family_trains_through_train(tmp_path):
    base = load_config("tiny", [f"output_dir={tmp_path}", "steps=30", "checkpoint.every=100",
                                "optim.learning_rate=1e-2", "data.height=32", "data.width=32"])
    cfg = dataclasses.replace(base, model=ToyConfig())
    r = train(cfg, progress=False)
    assert r.step == 30 and len(r.losses) == 30
    # starts near 2.2 (= E|noise - x0|^2 for unit-variance data), ends near 1.7
    assert np.mean(r.losses[-5:]) < 0.85 * np.mean(r.losses[:5]), r.losses
    assert set(r.state["params"]) == {"proj_in", "time", "text", "proj_out"}
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    # tokens per step come from the toy family: batch 8 × latent grid 5×8×8
    assert rows[-1]["tokens_per_s"] == pytest.approx(8 * 5 * 8 * 8 / rows[-1]["step_time"])
    r2 = train(dataclasses.replace(cfg, steps=32), progress=False)   # resumes the toy run
    assert r2.resumed_from == 30 and r2.step == 32
