"""Shape of FLUX.2's image VAE in diffusers' ``AutoencoderKLFlux2`` config names, checked.

``Flux2VAEConfig()`` is diffusers' default, which is FLUX.2's VAE: 32 latent channels, widths
128-256-512-512 (8x spatial), two residual blocks a level, GroupNorm with 32 groups, one-head
attention in the mid blocks, ``quant_conv`` and ``post_quant_conv`` on, tiles of 1024 pixels,
and a latent BatchNorm over ``patch_size`` (2x2) patchified latents (``4 x 32 = 128``
channels, eps 1e-4) whose running statistics the FLUX.2 pipelines use to normalise latents.

The encoder and decoder are diffusers' ``AutoencoderKL`` ones, so this config hands the KL
VAE's blocks (:mod:`ditax.models.vae.kl`) a :class:`~ditax.models.vae.kl.FluxVAEConfig` of
each side (:meth:`Flux2VAEConfig.encoder_config` / :meth:`Flux2VAEConfig.decoder_config`): the
decoder's widths may differ from the encoder's (``decoder_block_out_channels``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ditax.errors import ConfigError
from ditax.models.common.fields import known_fields
from ditax.models.vae.kl.config import FluxVAEConfig, KLGrid

_ACTIVATIONS = ("silu", "swish")   # diffusers' get_activation: both are SiLU
_IGNORED = ("force_upcast",)       # a torch fp16 switch; ditax's dtype is the caller's choice
_WHAT = "FLUX.2 VAE config"


@dataclass(frozen=True)
class Flux2VAEConfig(KLGrid):
    """Fields follow diffusers' ``AutoencoderKLFlux2`` (``vae/config.json``); defaults are its
    defaults. ``batch_norm_momentum`` only matters when training the statistics (kept, unused)."""

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    decoder_block_out_channels: tuple[int, ...] | None = None
    layers_per_block: int = 2
    act_fn: str = "silu"
    latent_channels: int = 32
    norm_num_groups: int = 32
    sample_size: int = 1024
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True
    batch_norm_eps: float = 1e-4
    batch_norm_momentum: float | None = 0.1
    patch_size: tuple[int, int] = (2, 2)

    @classmethod
    def from_diffusers(cls, cfg: dict) -> "Flux2VAEConfig":
        """From a diffusers ``config.json`` dict: missing keys take diffusers' defaults, keys
        this port does not know are logged and ignored (``_class_name`` and the like silently),
        then every value is checked (:meth:`validate`)."""
        kw = known_fields(cls, cfg, _WHAT, _IGNORED)
        if isinstance(kw.get("sample_size"), tuple):
            kw["sample_size"] = _square(kw["sample_size"])
        c = cls(**kw)
        c.validate()
        return c

    def validate(self) -> None:
        """Refuse what this port does not implement or what cannot build, naming the key, the
        value and the fix (one line)."""
        for name in ("in_channels", "out_channels", "latent_channels", "layers_per_block",
                     "norm_num_groups", "sample_size"):
            _positive_int(name, getattr(self, name))
        enc, dec = self.block_out_channels, self.decoder_widths
        for name, widths in (("block_out_channels", enc),
                             ("decoder_block_out_channels", dec)):
            if not isinstance(widths, tuple) or not widths or not all(
                    isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
                raise ConfigError(f"{_WHAT}: {name}={_show(widths)} must be a non-empty list "
                                  "of positive ints (one width per level)")
        if len(dec) != len(enc):
            raise ConfigError(f"{_WHAT}: decoder_block_out_channels={list(dec)} has {len(dec)} "
                              f"levels but block_out_channels={list(enc)} has {len(enc)}; give "
                              "both the same number of levels (the decoder must undo the "
                              "encoder's downsampling)")
        n = len(enc)
        for name, want in (("down_block_types", "DownEncoderBlock2D"),
                           ("up_block_types", "UpDecoderBlock2D")):
            v = getattr(self, name)
            if not isinstance(v, tuple) or len(v) != n or any(t != want for t in v):
                raise ConfigError(f"{_WHAT}: {name}={_show(v)} is not supported; ditax builds "
                                  f"{n} x {want!r} (one per block_out_channels entry)")
        if self.act_fn not in _ACTIVATIONS:
            raise ConfigError(f"{_WHAT}: act_fn={self.act_fn!r} is not supported; use 'silu'")
        g = self.norm_num_groups
        bad = sorted({w for w in enc + dec if w % g})
        if bad:
            raise ConfigError(f"{_WHAT}: norm_num_groups={g} does not divide the widths {bad} "
                              "of block_out_channels / decoder_block_out_channels; choose a "
                              "common divisor")
        for name in ("use_quant_conv", "use_post_quant_conv", "mid_block_add_attention"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{_WHAT}: {name}={getattr(self, name)!r} must be true or "
                                  "false")
        eps = self.batch_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ConfigError(f"{_WHAT}: batch_norm_eps={eps!r} must be a positive number "
                              "(FLUX.2: 0.0001); the latent std is sqrt(running_var + eps)")
        p = self.patch_size
        if not isinstance(p, tuple) or len(p) != 2 or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in p):
            raise ConfigError(f"{_WHAT}: patch_size={_show(p)} must be two positive ints "
                              "[height, width] (FLUX.2: [2, 2])")

    # --- derived sizes
    @property
    def decoder_widths(self) -> tuple[int, ...]:
        """The decoder's widths: ``decoder_block_out_channels``, else the encoder's."""
        d = self.decoder_block_out_channels
        return self.block_out_channels if d is None else d

    @property
    def bn_channels(self) -> int:
        """Channels of the latent BatchNorm: ``prod(patch_size) * latent_channels`` (128)."""
        return math.prod(self.patch_size) * self.latent_channels

    # --- the KL VAE's view of each side (its blocks read a FluxVAEConfig)
    def encoder_config(self) -> FluxVAEConfig:
        """The :class:`FluxVAEConfig` whose ``Encoder`` is this VAE's encoder."""
        return FluxVAEConfig(
            in_channels=self.in_channels, out_channels=self.out_channels,
            down_block_types=self.down_block_types, up_block_types=self.up_block_types,
            block_out_channels=self.block_out_channels, layers_per_block=self.layers_per_block,
            act_fn=self.act_fn, latent_channels=self.latent_channels,
            norm_num_groups=self.norm_num_groups, sample_size=self.sample_size,
            scaling_factor=1.0, shift_factor=None, use_quant_conv=self.use_quant_conv,
            use_post_quant_conv=self.use_post_quant_conv,
            mid_block_add_attention=self.mid_block_add_attention)

    def decoder_config(self) -> FluxVAEConfig:
        """The :class:`FluxVAEConfig` whose ``Decoder`` is this VAE's decoder (its widths)."""
        return dataclasses.replace(self.encoder_config(),
                                   block_out_channels=self.decoder_widths)


def _positive_int(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{_WHAT}: {name}={v!r} must be a positive int")


def _show(v):
    return list(v) if isinstance(v, tuple) else v


def _square(v: tuple):
    """``sample_size`` given as a list: diffusers compares the list itself with image sizes,
    so only equal sides mean one tile size."""
    if not v or len(set(v)) != 1:
        raise ConfigError(f"{_WHAT}: sample_size={list(v)} is not one tile size; give one int "
                          "(square tiles, as diffusers tiles)")
    return v[0]


__all__ = ["Flux2VAEConfig"]
