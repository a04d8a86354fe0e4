"""Shape of LTX-2's video VAE in diffusers' ``AutoencoderKLLTX2Video`` config names, resolved into
per-level plans, with the compression factors and the rules a config must meet.

``LTX2VideoVAEConfig()`` holds diffusers' defaults; the LTX-2 checkpoint's ``vae/config.json``
(diffusers' ``scripts/convert_ltx2_to_diffusers.py``, version "2.0") has four encoder levels
(spatial, temporal, spatio-temporal, spatio-temporal downsamplers), three residual 2x
spatio-temporal decoder levels, reflect padding in the decoder; LTX-2.3 has four decoder levels
(spatio-temporal, spatio-temporal, temporal, spatial; no residual; upsample factors 2, 2, 1, 2)
and zero padding. Both: 4x4 pixel patches, 128 latent channels, 32x spatial and 8x temporal
compression, a causal encoder and a non-causal decoder, optional timestep conditioning.

:meth:`LTX2VideoVAEConfig.encoder_levels` / :meth:`decoder_levels` give each level's input and
output widths and its resampler exactly as diffusers builds them (the decoder's ``in`` width is
diffusers' ``output_channel // upsample_factor``), so the modules need no arithmetic of their
own, and :meth:`validate` checks that the widths flow (diffusers would fail in ``forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ditax.errors import ConfigError
from ditax.models.common.fields import known_fields

#: (time, height, width) stride of each resampler kind
STRIDES = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2)}
PADDING_MODES = ("zeros", "reflect")
BLOCK_TYPE = "LTX2VideoDownBlock3D"
_BOOL_OR_TUPLE = {"spatio_temporal_scaling": -1, "decoder_spatio_temporal_scaling": -1,
                  "decoder_inject_noise": 0, "upsample_residual": -1}   # length: levels + this


@dataclass(frozen=True)
class DownLevel:
    """One encoder level: ``layers`` resnets at ``cin`` channels, then a ``down`` resampler
    (``STRIDES`` key, or None) to ``cout``."""

    cin: int
    cout: int
    layers: int
    down: str | None


@dataclass(frozen=True)
class UpLevel:
    """One decoder level: a ``cin → cout`` resnet (``conv_in``, only when they differ), an
    ``up`` resampler (``STRIDES`` key, or None) over ``cout * factor`` channels back to ``cout``
    (``residual``: plus its input shuffled the same way), then ``layers`` resnets at ``cout``."""

    cin: int
    cout: int
    layers: int
    up: str | None
    residual: bool
    factor: int


@dataclass(frozen=True)
class LTX2VideoVAEConfig:
    """Fields follow diffusers' ``AutoencoderKLLTX2Video`` config; the bool-or-tuple fields are
    tuples here (``from_diffusers`` expands a bool as diffusers does)."""

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 128
    block_out_channels: tuple[int, ...] = (256, 512, 1024, 2048)
    down_block_types: tuple[str, ...] = (BLOCK_TYPE,) * 4
    decoder_block_out_channels: tuple[int, ...] = (256, 512, 1024)
    layers_per_block: tuple[int, ...] = (4, 6, 6, 2, 2)
    decoder_layers_per_block: tuple[int, ...] = (5, 5, 5, 5)
    spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, True)
    decoder_spatio_temporal_scaling: tuple[bool, ...] = (True, True, True)
    decoder_inject_noise: tuple[bool, ...] = (False, False, False, False)
    downsample_type: tuple[str, ...] = ("spatial", "temporal", "spatiotemporal", "spatiotemporal")
    upsample_type: tuple[str, ...] = ("spatiotemporal",) * 3
    upsample_residual: tuple[bool, ...] = (True, True, True)
    upsample_factor: tuple[int, ...] = (2, 2, 2)
    timestep_conditioning: bool = False
    patch_size: int = 4
    patch_size_t: int = 1
    resnet_norm_eps: float = 1e-6
    scaling_factor: float = 1.0
    encoder_causal: bool = True
    decoder_causal: bool = True
    encoder_spatial_padding_mode: str = "zeros"
    decoder_spatial_padding_mode: str = "reflect"
    spatial_compression_ratio: int | None = None
    temporal_compression_ratio: int | None = None

    @classmethod
    def from_diffusers(cls, cfg: dict) -> "LTX2VideoVAEConfig":
        """From a diffusers ``config.json`` dict (validated); unknown keys are logged and
        ignored, lists become tuples, a bool where diffusers takes bool-or-tuple is repeated
        over the levels as diffusers repeats it."""
        kw = known_fields(cls, cfg, "LTX2VideoVAE config")
        defaults = cls()
        n_enc = len(kw.get("layers_per_block", defaults.layers_per_block))
        n_dec = len(kw.get("decoder_layers_per_block", defaults.decoder_layers_per_block))
        for name, extra in _BOOL_OR_TUPLE.items():
            if isinstance(kw.get(name), bool):
                n = (n_enc if name == "spatio_temporal_scaling" else n_dec) + extra
                kw[name] = (kw[name],) * n
        c = cls(**kw)
        c.validate()
        return c

    # --- factors
    def _product(self, kinds, axis: int) -> int:
        out = 1
        for k in kinds:
            if k is not None:
                out *= STRIDES[k][axis]
        return out

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent pixel: the patch side times each encoder downsampler's spatial
        stride (32 for LTX-2)."""
        return self.patch_size * self._product((lv.down for lv in self.encoder_levels()), 1)

    @property
    def temporal_factor(self) -> int:
        """Frames per latent frame after the first (8 for LTX-2): a video has ``8k + 1``
        frames and ``k + 1`` latent frames."""
        return self.patch_size_t * self._product((lv.down for lv in self.encoder_levels()), 0)

    def latent_grid(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """Latent ``(F', Y, X)`` of a ``num_frames x height x width`` video (floor division;
        callers check divisibility with their own names in the message)."""
        tf, sf = self.temporal_factor, self.spatial_factor
        return (num_frames - 1) // tf + 1, height // sf, width // sf

    # --- levels
    def encoder_levels(self) -> list[DownLevel]:
        """The encoder's levels after ``conv_in`` (which maps the patches to
        ``latent_channels``)."""
        out, levels = self.latent_channels, []
        for i, cout in enumerate(self.block_out_channels):
            down = self.downsample_type[i] if self.spatio_temporal_scaling[i] else None
            levels.append(DownLevel(out, cout, self.layers_per_block[i], down))
            out = cout
        return levels

    def decoder_levels(self) -> list[UpLevel]:
        """The decoder's levels after the mid block, in decoding order (diffusers reverses every
        per-level field but ``upsample_type``)."""
        rev = lambda v: tuple(reversed(v))  # noqa: E731
        widths, layers = rev(self.decoder_block_out_channels), rev(self.decoder_layers_per_block)
        scaling, residual = rev(self.decoder_spatio_temporal_scaling), rev(self.upsample_residual)
        factors = rev(self.upsample_factor)
        out, levels = widths[0], []
        for i, width in enumerate(widths):
            f = factors[i]
            cin, cout = out // f, width // f
            up = self.upsample_type[i] if scaling[i] else None
            levels.append(UpLevel(cin, cout, layers[i + 1], up, bool(residual[i]), f))
            out = cout
        return levels

    # --- rules
    def validate(self) -> None:
        """Refuse what this port does not implement or what diffusers could not run, naming the
        key and the fix."""
        self._check_lengths()
        for name in ("encoder_spatial_padding_mode", "decoder_spatial_padding_mode"):
            if getattr(self, name) not in PADDING_MODES:
                raise NotImplementedError(
                    f"LTX2VideoVAE: {name}={getattr(self, name)!r} is not supported; LTX-2 "
                    f"checkpoints use one of {PADDING_MODES}")
        if self.patch_size_t != 1:
            raise NotImplementedError(f"LTX2VideoVAE: patch_size_t={self.patch_size_t} is not "
                                      "supported (every LTX-2 checkpoint uses 1)")
        if any(self.decoder_inject_noise):
            raise NotImplementedError(
                f"LTX2VideoVAE: decoder_inject_noise={list(self.decoder_inject_noise)} is not "
                "supported (fresh torch noise on every call; no LTX-2 checkpoint uses it); set "
                "it to false")
        if any(t != BLOCK_TYPE for t in self.down_block_types):
            raise ConfigError(f"LTX2VideoVAE: down_block_types={list(self.down_block_types)}: "
                              f"every entry must be {BLOCK_TYPE!r}")
        self._check_encoder()
        self._check_decoder()
        self._check_ratios()

    def _check_lengths(self) -> None:
        n, m = len(self.block_out_channels), len(self.decoder_block_out_channels)
        want = {"down_block_types": n, "spatio_temporal_scaling": n, "downsample_type": n,
                "layers_per_block": n + 1, "decoder_layers_per_block": m + 1,
                "decoder_spatio_temporal_scaling": m, "upsample_type": m,
                "upsample_residual": m, "upsample_factor": m, "decoder_inject_noise": m + 1}
        for name, k in want.items():
            if len(getattr(self, name)) != k:
                raise ConfigError(f"LTX2VideoVAE: {name} has {len(getattr(self, name))} entries, "
                                  f"expected {k} (block_out_channels has {n} levels, "
                                  f"decoder_block_out_channels {m})")

    def _check_encoder(self) -> None:
        for i, lv in enumerate(self.encoder_levels()):
            if lv.down is None:
                if lv.cin != lv.cout:
                    raise ConfigError(f"LTX2VideoVAE: encoder level {i} has no downsampler, so "
                                      f"it keeps {lv.cin} channels, but block_out_channels[{i}]="
                                      f"{lv.cout}; make them equal")
                continue
            if lv.down not in STRIDES:
                kind = ("not supported (no LTX-2 checkpoint uses it)" if lv.down == "conv"
                        else f"not one of {sorted(STRIDES)}")
                raise NotImplementedError(f"LTX2VideoVAE: downsample_type[{i}]={lv.down!r} is "
                                          f"{kind}")
            p = _prod(STRIDES[lv.down])
            if lv.cout % p or lv.cin * p % lv.cout:
                raise ConfigError(f"LTX2VideoVAE: encoder level {i} ({lv.down}) folds {lv.cin} "
                                  f"channels x {p} positions into {lv.cout}, which does not "
                                  "divide; change block_out_channels")

    def _check_decoder(self) -> None:
        have = self.decoder_block_out_channels[-1]   # the mid block's width
        for i, lv in enumerate(self.decoder_levels()):
            if lv.cin != lv.cout:
                if self.timestep_conditioning:
                    raise NotImplementedError(
                        f"LTX2VideoVAE: decoder level {i} changes width ({lv.cin} -> {lv.cout}) "
                        "with timestep_conditioning=true, which diffusers cannot run either "
                        "(its conv_in gets the raw timestep); change decoder_block_out_channels")
                if have != lv.cin:
                    raise ConfigError(self._flow(i, have, lv.cin))
                have = lv.cout
            want = lv.cout * lv.factor if lv.up else lv.cout
            if have != want:
                raise ConfigError(self._flow(i, have, want))
            if lv.up and lv.up not in STRIDES:
                raise ConfigError(f"LTX2VideoVAE: upsample_type[{i}]={lv.up!r} is not one of "
                                  f"{sorted(STRIDES)}")
            n = _prod(STRIDES[lv.up]) if lv.up else 1
            if lv.up and lv.residual and (want % n or n % lv.factor):
                raise ConfigError(f"LTX2VideoVAE: decoder level {i}'s residual spreads {want} "
                                  f"channels over {n} positions with upsample factor "
                                  f"{lv.factor}, which does not divide; change "
                                  "decoder_block_out_channels / upsample_factor")
            have = lv.cout

    def _flow(self, i: int, have: int, want: int) -> str:
        return (f"LTX2VideoVAE: decoder level {i} receives {have} channels but is built for "
                f"{want} (decoder_block_out_channels={list(self.decoder_block_out_channels)}, "
                f"upsample_factor={list(self.upsample_factor)}); fix them as diffusers' "
                "AutoencoderKLLTX2Video would need")

    def _check_ratios(self) -> None:
        downs = [lv.down for lv in self.encoder_levels()]
        ups = [lv.up for lv in self.decoder_levels()]
        sf, tf = self.spatial_factor, self.temporal_factor
        dec = (self.patch_size * self._product(ups, 1), self.patch_size_t * self._product(ups, 0))
        if dec != (sf, tf):
            raise ConfigError(f"LTX2VideoVAE: the encoder compresses {sf}x spatially and {tf}x in "
                              f"time but the decoder expands {dec[0]}x and {dec[1]}x; fix "
                              "upsample_type / decoder_spatio_temporal_scaling")
        # diffusers' own default counts every scaling level as 2x on both axes
        n = sum(map(bool, self.spatio_temporal_scaling))
        for name, given, default, real in (
                ("spatial_compression_ratio", self.spatial_compression_ratio,
                 self.patch_size * 2 ** n, sf),
                ("temporal_compression_ratio", self.temporal_compression_ratio,
                 self.patch_size_t * 2 ** n, tf)):
            used = default if given is None else given
            if used != real:
                raise ConfigError(f"LTX2VideoVAE: {name} is {used}"
                                  f"{' (diffusers default)' if given is None else ''} but the "
                                  f"architecture gives {real} (downsample_type={downs}); set "
                                  f"\"{name}\": {real} in config.json")


def _prod(v) -> int:
    out = 1
    for x in v:
        out *= x
    return out


__all__ = ["DownLevel", "LTX2VideoVAEConfig", "STRIDES", "UpLevel"]
