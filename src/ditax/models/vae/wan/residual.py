"""Level blocks of the Wan 2.2 VAE (diffusers ``WanResidualDownBlock`` / ``WanResidualUpBlock``).

In the 2.2 VAE every resolution level is one block whose output adds a parameter-free shortcut
of its input: the encoder's pools the input down to the level's output grid (:func:`.avg_down`),
the decoder's spreads it up (:func:`.dup_up`). The main path is the 2.1 residual blocks and
resampler of :mod:`.blocks`; the decoder's upsampler keeps the channel count (2.1 halves it).
:func:`down_blocks` / :func:`up_blocks` build a coder's levels from the config.

Blocks take channels-last ``[B, F, Y, X, C]``, their cache slice and ``first`` (the first chunk
of a video), and return ``(output, new cache)``.
"""

from __future__ import annotations

import jax
from flax import nnx

from ditax.models.vae.wan.blocks import Resample, ResidualBlock
from ditax.models.vae.wan.config import WanVAEConfig
from ditax.models.vae.wan.layers import Cache, pad_axis
from ditax.models.vae.wan.shuffle import avg_down, dup_up


def _run(resnets, x: jax.Array, caches) -> tuple[jax.Array, list]:
    out = []
    for layer, c in zip(resnets, caches):
        x, c = layer(x, c)
        out.append(c)
    return x, out


class ResidualDownBlock(nnx.Module):
    """``num_res_blocks`` residual blocks, an optional 2x downsampler (in time too when
    ``temporal``), plus the input average-pooled to the output grid."""

    def __init__(self, cin: int, cout: int, num_res_blocks: int, temporal: bool, down: bool, *,
                 dtype, rngs):
        self.cout, self.ft, self.fs = cout, (2 if temporal else 1), (2 if down else 1)
        res = []
        for _ in range(num_res_blocks):
            res.append(ResidualBlock(cin, cout, dtype=dtype, rngs=rngs))
            cin = cout
        self.resnets = nnx.List(res)
        mode = "downsample3d" if temporal else "downsample2d"
        self.downsampler = Resample(cout, mode, dtype=dtype, rngs=rngs) if down else None

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        """x ``[B, F, Y, X, C_in]`` → (``[B, F/ft, Y/fs, X/fs, C_out]``, cache)."""
        cache = cache or {"resnets": [None] * len(self.resnets)}
        shortcut = avg_down(x, self.cout, self.ft, self.fs)
        x, c_res = _run(self.resnets, x, cache["resnets"])
        c_down = None
        if self.downsampler is not None:
            x, c_down = self.downsampler(x, cache.get("downsampler"), first)
        return x + shortcut, {"resnets": c_res, "downsampler": c_down}


class ResidualUpBlock(nnx.Module):
    """``num_res_blocks + 1`` residual blocks; with ``up``, a 2x upsampler (in time too when
    ``temporal``) plus the input duplicated onto the output grid."""

    def __init__(self, cin: int, cout: int, num_res_blocks: int, temporal: bool, up: bool, *,
                 dtype, rngs):
        self.cout, self.ft = cout, (2 if temporal else 1)
        res = []
        for _ in range(num_res_blocks + 1):
            res.append(ResidualBlock(cin, cout, dtype=dtype, rngs=rngs))
            cin = cout
        self.resnets = nnx.List(res)
        mode = "upsample3d" if temporal else "upsample2d"
        self.upsampler = Resample(cout, mode, cout, dtype=dtype, rngs=rngs) if up else None

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        """x ``[B, F, Y, X, C_in]`` → (``[B, F', 2Y, 2X, C_out]`` when upsampling, cache);
        ``F' = F ft``, less ``ft - 1`` on the first chunk."""
        cache = cache or {"resnets": [None] * len(self.resnets)}
        x0 = x
        x, c_res = _run(self.resnets, x, cache["resnets"])
        if self.upsampler is None:
            return x, {"resnets": c_res, "upsampler": None}
        x, c_up = self.upsampler(x, cache.get("upsampler"), first)
        cin = self.resnets[0].norm1.gamma.shape[0]   # the fast path pads channels: the real ones
        shortcut = pad_axis(dup_up(x0[..., :cin], self.cout, self.ft, 2, first), 4, x.shape[-1])
        return x + shortcut, {"resnets": c_res, "upsampler": c_up}


def down_blocks(cfg: WanVAEConfig, dims: list[int], *, dtype, rngs) -> list[ResidualDownBlock]:
    """The encoder's levels: ``dims[i] → dims[i + 1]``; all but the last halve Y and X."""
    last = len(dims) - 2
    return [ResidualDownBlock(cin, cout, cfg.num_res_blocks, i < last and bool(cfg.temperal_downsample[i]),
                              i < last, dtype=dtype, rngs=rngs)
            for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:]))]


def up_blocks(cfg: WanVAEConfig, dims: list[int], *, dtype, rngs) -> list[ResidualUpBlock]:
    """The decoder's levels: ``dims[i] → dims[i + 1]``; all but the last double Y and X."""
    last = len(dims) - 2
    ups = cfg.temperal_downsample[::-1]
    return [ResidualUpBlock(cin, cout, cfg.num_res_blocks, i < last and bool(ups[i]), i < last,
                            dtype=dtype, rngs=rngs)
            for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:]))]


__all__ = ["ResidualDownBlock", "ResidualUpBlock", "down_blocks", "up_blocks"]
