"""Shape of LTX-2's latent upsampler in diffusers' ``LTX2LatentUpsamplerModel`` config names,
and the rules a config must meet.

The model maps raw (denormalised) video latents ``[B, C, F, Y, X]`` to latents of a larger grid:
2x in space (LTX-2's ``latent_upsampler/``), or a rational factor in space (0.75, 1.5, 2, 4:
``num / den``, upsampled by ``num`` then blurred and strided by ``den``), 2x in time (the first
frame dropped, keeping ``8k + 1`` frames causal), or both 2x. Published folders name two fields
differently (``rational_resampler`` / ``spatial_scale``, the original LTX-2 names);
:meth:`LatentUpsamplerConfig.from_diffusers` reads either spelling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ditax.errors import ConfigError

#: the rational spatial factors diffusers builds, as (numerator, denominator)
RATIONAL_SCALES = {0.75: (3, 4), 1.5: (3, 2), 2.0: (2, 1), 4.0: (4, 1)}
GROUPS = 32          # every GroupNorm of the model (diffusers' fixed 32 groups)
BLUR_KERNEL = 5      # the binomial anti-alias kernel of the rational resampler

#: older config names (the original LTX-2 release's) → diffusers' current ones
_ALIASES = {"rational_resampler": "use_rational_resampler",
            "spatial_scale": "rational_spatial_scale"}


@dataclass(frozen=True)
class LatentUpsamplerConfig:
    """Fields follow diffusers' ``LTX2LatentUpsamplerModel`` config (its defaults)."""

    in_channels: int = 128
    mid_channels: int = 1024
    num_blocks_per_stage: int = 4
    dims: int = 3
    spatial_upsample: bool = True
    temporal_upsample: bool = False
    rational_spatial_scale: float = 2.0
    use_rational_resampler: bool = True

    @classmethod
    def from_diffusers(cls, raw: dict) -> "LatentUpsamplerConfig":
        """From a ``latent_upsampler/config.json`` object; keys that are not fields (``_class_name``,
        versions) are ignored; the config is validated."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {}
        for key, value in raw.items():
            key = _ALIASES.get(key, key) if key not in names else key
            if key in names and key not in kw:
                kw[key] = value
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    @property
    def rational(self) -> bool:
        """Whether the spatial upsampler is the rational resampler (conv, shuffle, blur)."""
        return self.spatial_upsample and not self.temporal_upsample and \
            self.use_rational_resampler

    @property
    def factors(self) -> tuple[int, int, int]:
        """The ``(time, space)`` pixel-shuffle factors as ``(st, num, den)``: frames ``F →
        st F - (st - 1)``, each side ``Y → Y num / den``."""
        st = 2 if self.temporal_upsample else 1
        if not self.spatial_upsample:
            return st, 1, 1
        if self.rational:
            return (st,) + RATIONAL_SCALES[float(self.rational_spatial_scale)]
        return st, 2, 1

    def out_grid(self, f: int, y: int, x: int) -> tuple[int, int, int]:
        """The latent ``(F, Y, X)`` out of one of ``(f, y, x)`` (the strided blur rounds up,
        as its padded convolution does)."""
        st, num, den = self.factors
        side = [-(-(n * num) // den) for n in (y, x)]
        return st * f - (st - 1), side[0], side[1]

    def validate(self) -> None:
        """Raise :class:`ConfigError` for a config diffusers cannot build or run."""
        for name in ("in_channels", "mid_channels", "num_blocks_per_stage", "dims"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name ==
                                                                     "num_blocks_per_stage" else 1):
                raise ConfigError(f"latent upsampler {name}={v!r}; expected a positive int")
        if self.mid_channels % GROUPS:
            raise ConfigError(f"latent upsampler mid_channels={self.mid_channels} is no multiple "
                              f"of {GROUPS} (its GroupNorms have {GROUPS} groups)")
        if self.dims not in (2, 3):
            raise ConfigError(f"latent upsampler dims={self.dims}; expected 2 (per-frame "
                              f"convolutions) or 3")
        if not (self.spatial_upsample or self.temporal_upsample):
            raise ConfigError("latent upsampler: spatial_upsample and temporal_upsample are both "
                              "false; set at least one")
        if self.temporal_upsample and self.dims == 2:
            raise ConfigError("latent upsampler: temporal_upsample needs dims=3 (a 2-D model "
                              "sees frames one by one); set dims=3 or temporal_upsample=false")
        if self.rational and float(self.rational_spatial_scale) not in RATIONAL_SCALES:
            raise ConfigError(f"latent upsampler rational_spatial_scale="
                              f"{self.rational_spatial_scale}; the rational resampler takes "
                              f"{sorted(RATIONAL_SCALES)}")


__all__ = ["BLUR_KERNEL", "GROUPS", "LatentUpsamplerConfig", "RATIONAL_SCALES"]
