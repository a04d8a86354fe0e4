"""Shape of an image VAE in diffusers' ``AutoencoderKL`` config names (the FLUX.1 VAE and the
SD-style ones), its spatial factor, tile sizes and latent normalisation constants.

``FluxVAEConfig()`` is the FLUX.1 VAE: 16 latent channels, widths 128-256-512-512, two
residual blocks a level, GroupNorm with 32 groups, SiLU, one-head attention in the mid
blocks, no ``quant_conv`` / ``post_quant_conv``, ``scaling_factor`` 0.3611 and ``shift_factor``
0.1159, tiles of ``sample_size`` 1024 pixels. SD-style folders (4 latent channels, quant convs,
no shift) load through the same class.
"""

from __future__ import annotations

from dataclasses import dataclass

from ditax.errors import ConfigError
from ditax.models.common.fields import known_fields

#: diffusers' fixed overlap of neighbouring tiles (``AutoencoderKL.tile_overlap_factor``)
TILE_OVERLAP_FACTOR = 0.25

_ACTIVATIONS = ("silu", "swish")   # diffusers' get_activation: both are SiLU
_IGNORED = ("force_upcast",)       # a torch fp16 switch; ditax's dtype is the caller's choice


class KLGrid:
    """The pixel ↔ latent grid of a KL VAE config (FLUX.1's :class:`FluxVAEConfig`, FLUX.2's
    :class:`~ditax.models.vae.flux2.config.Flux2VAEConfig`): ``block_out_channels`` levels,
    tiles of ``sample_size`` pixels."""

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent pixel along each axis: 2 per level but the last (8 for FLUX)."""
        return 2 ** (len(self.block_out_channels) - 1)

    @property
    def tile_sample_min_size(self) -> int:
        """Pixels of a tile's side (diffusers: ``sample_size``)."""
        return self.sample_size

    @property
    def tile_latent_min_size(self) -> int:
        """Latent pixels of a tile's side: ``int(sample_size / spatial_factor)``, as diffusers."""
        return int(self.sample_size / self.spatial_factor)


@dataclass(frozen=True)
class FluxVAEConfig(KLGrid):
    """Fields follow diffusers' ``AutoencoderKL`` config (``config.json``)."""

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    act_fn: str = "silu"
    latent_channels: int = 16
    norm_num_groups: int = 32
    sample_size: int = 1024
    scaling_factor: float = 0.3611
    shift_factor: float | None = 0.1159
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None
    use_quant_conv: bool = False
    use_post_quant_conv: bool = False
    mid_block_add_attention: bool = True

    @classmethod
    def from_diffusers(cls, cfg: dict) -> "FluxVAEConfig":
        """From a diffusers ``config.json`` dict; keys this port does not know are logged and
        ignored (``_class_name`` and the like silently). Missing keys take diffusers' defaults
        for ``AutoencoderKL`` where they differ from FLUX's (quant convs on, no shift)."""
        kw = dict(use_quant_conv=True, use_post_quant_conv=True, shift_factor=None,
                  scaling_factor=0.18215, sample_size=32, latent_channels=4,
                  block_out_channels=(64,), layers_per_block=1,
                  down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",))
        kw.update(known_fields(cls, cfg, "FluxVAE config", _IGNORED))
        kw["sample_size"] = _square(kw["sample_size"])
        c = cls(**kw)
        c.validate()
        return c

    def validate(self) -> None:
        """Refuse what this port does not implement or what cannot build, naming the key."""
        n = len(self.block_out_channels)
        if n == 0:
            raise ConfigError("FluxVAE: block_out_channels is empty; give one width per level")
        for name, want in (("down_block_types", "DownEncoderBlock2D"),
                           ("up_block_types", "UpDecoderBlock2D")):
            v = getattr(self, name)
            if len(v) != n or any(t != want for t in v):
                raise ConfigError(f"FluxVAE: {name}={list(v)} is not supported; ditax builds "
                                  f"{n} x {want!r} (one per block_out_channels entry)")
        if self.act_fn not in _ACTIVATIONS:
            raise ConfigError(f"FluxVAE: act_fn={self.act_fn!r} is not supported; use 'silu'")
        g = self.norm_num_groups
        bad = [c for c in self.block_out_channels if g <= 0 or c % g]
        if bad:
            raise ConfigError(f"FluxVAE: norm_num_groups={g} does not divide the widths {bad} "
                              "of block_out_channels; choose a common divisor")
        for name in ("in_channels", "out_channels", "latent_channels", "layers_per_block",
                     "sample_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"FluxVAE: {name}={getattr(self, name)} must be >= 1")
        if not self.scaling_factor:
            raise ConfigError("FluxVAE: scaling_factor=0 cannot normalise latents; use the "
                              "folder's value (FLUX.1: 0.3611)")

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """``(latent_channels, height / s, width / s)`` of an image (``s`` the spatial factor)."""
        s = self.spatial_factor
        return self.latent_channels, height // s, width // s


def _square(v) -> int:
    """``sample_size`` as one int: diffusers reads element 0 of a list for the latent tile and
    compares the list itself with image sizes, so only equal sides mean one thing."""
    if isinstance(v, (tuple, list)):
        if not v or len(set(v)) != 1:
            raise ConfigError(f"FluxVAE: sample_size={list(v)} is not one tile size; give one int "
                              "(square tiles, as diffusers tiles)")
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"FluxVAE: sample_size={v!r} must be an int (pixels of a tile's side)")
    return v


__all__ = ["KLGrid", "FluxVAEConfig", "TILE_OVERLAP_FACTOR"]
