"""Shape of the Wan video VAE (diffusers ``AutoencoderKLWan`` config names) and its factors.

The factors say how a video maps onto latents: ``temporal_factor`` frames per latent frame
(after the first frame, which has a latent frame of its own) and ``spatial_factor`` pixels per
latent pixel. Code that sizes latents (pipelines, training data, planning, benchmarks) reads
them here instead of writing 4 and 8; ``WanVAEConfig()`` is the Wan 2.1 VAE, which Wan 2.1 and
Wan 2.2 T2V-A14B use. The Wan 2.2 TI2V-5B VAE is ``is_residual=True, patch_size=2`` (residual
blocks with pooled / duplicated shortcuts, 2x2 pixel patches as channels: 16x spatial).
"""

from __future__ import annotations

from dataclasses import dataclass

from ditax.errors import ConfigError
from ditax.models.common.fields import known_fields


@dataclass(frozen=True)
class WanVAEConfig:
    """Shape of the VAE; field names follow diffusers' ``AutoencoderKLWan`` config."""

    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0
    latents_mean: tuple[float, ...] = ()
    latents_std: tuple[float, ...] = ()
    is_residual: bool = False
    in_channels: int = 3
    out_channels: int = 3
    patch_size: int | None = None
    scale_factor_temporal: int | None = 4
    scale_factor_spatial: int | None = 8

    @classmethod
    def from_diffusers(cls, cfg: dict) -> "WanVAEConfig":
        """Build from a diffusers ``config.json`` dict; unknown keys are logged and ignored."""
        c = cls(**known_fields(cls, cfg, "WanVAE config"))
        c.validate()
        return c

    def validate(self) -> None:
        """Reject configurations this port does not implement, with the reason and the fix."""
        patched = self.patch_size not in (None, 1)
        if self.is_residual != patched:
            raise NotImplementedError(
                f"WanVAE: is_residual={self.is_residual}, patch_size={self.patch_size} mixes the two Wan "
                "VAEs; ditax implements the Wan 2.1 VAE (is_residual=false, patch_size=null) and the Wan "
                "2.2 TI2V-5B VAE (is_residual=true with patch_size=2); fix config.json to one of them.")
        if self.attn_scales:
            raise NotImplementedError(
                f"WanVAE: attn_scales={list(self.attn_scales)} is not supported (diffusers' encoder "
                "cannot run it either); use attn_scales=[]. The mid-block attention is always present.")
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise ConfigError(
                f"WanVAE: temperal_downsample has {len(self.temperal_downsample)} entries, expected "
                f"len(dim_mult) - 1 = {len(self.dim_mult) - 1}.")
        for name in ("latents_mean", "latents_std"):
            v = getattr(self, name)
            if v and len(v) != self.z_dim:
                raise ConfigError(f"WanVAE: {name} has {len(v)} entries, expected z_dim={self.z_dim}.")
        if patched:
            self._check_patched()

    def _check_patched(self) -> None:
        """Channel counts of the Wan 2.2 VAE: patches and the pooled / duplicated shortcuts fit."""
        p2 = self.patch_size ** 2
        for name in ("in_channels", "out_channels"):
            if getattr(self, name) % p2:
                raise ConfigError(f"WanVAE: {name}={getattr(self, name)} must be a multiple of "
                                  f"patch_size**2={p2} (video channels x patch pixels).")
        last = len(self.dim_mult) - 1
        enc = [self.base_dim * u for u in (1, *self.dim_mult)]
        dec_base = self.decoder_base_dim or self.base_dim
        dec = [dec_base * u for u in (self.dim_mult[-1], *self.dim_mult[::-1])]
        ups = self.temperal_downsample[::-1]
        for i in range(last + 1):
            down = (2 if i < last and self.temperal_downsample[i] else 1) * (4 if i < last else 1)
            if enc[i] * down % enc[i + 1]:
                raise ConfigError(f"WanVAE: encoder level {i} pools {enc[i]} channels x {down} "
                                  f"positions into {enc[i + 1]}, which does not divide; change "
                                  "base_dim / dim_mult.")
            up = (2 if i < last and ups[i] else 1) * 4
            if i < last and dec[i + 1] * up % dec[i]:
                raise ConfigError(f"WanVAE: decoder level {i} spreads {dec[i]} channels over "
                                  f"{dec[i + 1]} x {up} positions, which does not divide; change "
                                  "decoder_base_dim / dim_mult.")

    @property
    def video_channels(self) -> int:
        """Colour channels of the video (``in_channels`` counts patch pixels too when patched)."""
        return self.in_channels // (self.patch_size or 1) ** 2

    @property
    def temporal_factor(self) -> int:
        """Frames per latent frame implied by the architecture (4 for Wan 2.1)."""
        return 2 ** sum(bool(t) for t in self.temperal_downsample)

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent pixel implied by the architecture (8 for Wan 2.1; a patchified
        VAE, ``patch_size`` p, multiplies it by p)."""
        return 2 ** (len(self.dim_mult) - 1) * (self.patch_size or 1)

    def latent_grid(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """Latent ``(F', Y, X)`` of a ``num_frames x height x width`` video:
        ``F' = (F - 1) / temporal_factor + 1``, ``Y = H / spatial_factor``, ``X = W / spatial_factor``
        (floor division; callers check divisibility with their own names in the message)."""
        tf, sf = self.temporal_factor, self.spatial_factor
        return (num_frames - 1) // tf + 1, height // sf, width // sf


def vae_preset(name: str) -> WanVAEConfig:
    """The VAE of a Wan model (``model.vae``): ``wan2.1`` (Wan 2.1, Wan 2.2 A14B: 16 channels,
    8x spatial) or ``wan2.2`` (Wan 2.2 TI2V-5B: 48 channels, 2x2 patches, 16x spatial)."""
    if name == "wan2.1":
        return WanVAEConfig()
    if name == "wan2.2":
        return WanVAEConfig(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True,
                            patch_size=2, in_channels=12, out_channels=12,
                            scale_factor_spatial=16)
    raise ConfigError(f"model.vae={name!r} is not one of wan2.1, wan2.2")


__all__ = ["WanVAEConfig", "vae_preset"]
