"""What the test-defined toy families share: a :class:`~ditax.models.base.ModelFamily` base
over a config with ``channels`` and ``text_dim`` whose video encoder is a 4x spatial
patchify (latent ``(F, H/4, W/4)``), one token per latent pixel, parameters replicated; a toy
denoiser speaking :class:`ditax.models.base.Denoiser` (per-token residual blocks over the latent
channels, modulated by time and the mean text; config fields ``channels``, ``text_dim``,
``width``, ``freq_dim``, ``num_layers``), its ModelInputs rule and a text encoder drawn from the
prompt's CRC. Each toy test subclasses the family with its own name and FLOPs."""

import zlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.errors import ConfigError
from ditax.models.base import ModelFamily
from ditax.nn import Linear, TimestepEmbedding, timestep_embedding


class ToyEmbedded(NamedTuple):
    """The toy's context: what the step cache may read (seq, mod, temb) and the grid."""

    seq: int
    mod: Any
    temb: Any
    shape: tuple


class ToyDenoiser(nnx.Module):
    """Per-token residual MLP blocks over the latent channels, modulated by the timestep and
    the mean text; speaks :class:`ditax.models.base.Denoiser`."""

    def __init__(self, cfg, rngs: nnx.Rngs):
        kw = dict(dtype="float32", param_dtype="float32", rngs=rngs)
        self.cfg, self.mesh = cfg, None
        self.proj_in = Linear(cfg.channels, cfg.width, **kw)
        self.time = TimestepEmbedding(cfg.freq_dim, cfg.width, **kw)
        self.text = Linear(cfg.text_dim, cfg.width, **kw)
        self.blocks = nnx.Param(jax.random.normal(rngs.params(), (cfg.num_layers, cfg.width,
                                                                  cfg.width)) / cfg.width ** 0.5)
        self.proj_out = Linear(cfg.width, cfg.channels, **kw)

    @property
    def block_stacks(self):
        return (("blocks", self.cfg.num_layers),)

    def embed(self, x, timestep, text):
        b, c, f, y, xx = x.shape
        h = self.proj_in(jnp.moveaxis(x, 1, -1).reshape(b, f * y * xx, c))     # [B, L, D]
        temb = self.time(timestep_embedding(timestep, self.cfg.freq_dim))     # [B, D]
        mod = temb + self.text(text.mean(1))
        return h, ToyEmbedded(seq=f * y * xx, mod=mod, temb=temb, shape=(b, c, f, y, xx))

    def run_blocks(self, h, ctx, start=0, stop=None):
        stop = self.cfg.num_layers if stop is None else stop
        for i in range(start, stop):
            h = h + jnp.tanh(h @ self.blocks[...][i] + ctx.mod[:, None])
        return h

    def head(self, h, ctx):
        b, c, f, y, xx = ctx.shape
        return jnp.moveaxis(self.proj_out(h).reshape(b, f, y, xx, c), -1, 1)

    def __call__(self, x, timestep, text):
        h, ctx = self.embed(x, timestep, text)
        return self.head(self.run_blocks(h, ctx), ctx)


def toy_inputs(model, condition, latents, t):
    """The toy's ModelInputs: the latents as they are, one timestep per sample, no extras."""
    return latents, jnp.full((latents.shape[0],), t), {}


def toy_text(prompt: str, text_len: int, text_dim: int) -> np.ndarray:
    """The toy's text encoder: ``[T, Dt]`` drawn from the prompt's CRC (empty: zeros)."""
    if not prompt:
        return np.zeros((text_len, text_dim), np.float32)
    rng = np.random.default_rng(zlib.crc32(prompt.encode()))
    return rng.standard_normal((text_len, text_dim)).astype(np.float32)


class ToyFamilyBase(ModelFamily):
    latent_channels = property(lambda self: self.model.channels)
    text_dim = property(lambda self: self.model.text_dim)

    @classmethod
    def latent_grid(cls, num_frames, height, width):
        if height % 4 or width % 4:
            raise ConfigError(f"height x width = {height}x{width} must be multiples of 4")
        return num_frames, height // 4, width // 4

    def tokens_per_sample(self, latent_shape):
        return int(np.prod(latent_shape[1:]))

    def param_shardings(self, params, mesh):
        return jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
