"""Shape of LTX-2's audio VAE in diffusers' ``AutoencoderKLLTX2Audio`` config names, and the
factors that size its latents.

The VAE works on log-mel spectrograms ``[B, in_channels, T, mel_bins]`` (stereo: 2 channels; T
mel frames of ``mel_hop_length`` samples at ``sample_rate``). ``LTX2AudioVAEConfig()`` is the
public LTX-2 / 2.3 / 2.5 audio VAE: widths 128-256-512, two residual blocks a level, pixel
(RMS) norms, convolutions causal along time (``causality_axis="height"``: the time axis is the
spectrogram's height), no attention, 8 latent channels; it turns 64 mel bins into 16 and
``4F - 3`` mel frames into F latent frames.

diffusers hard-codes the latent factor 4 (``LATENT_DOWNSAMPLE_FACTOR``) in the decoder's output
length and in the pipeline's arithmetic, whatever ``ch_mult`` says; :data:`LATENT_FACTOR` is that
number, :attr:`LTX2AudioVAEConfig.downsample_factor` what the architecture does (equal for
every public model).
"""

from __future__ import annotations

from dataclasses import dataclass

from ditax.errors import ConfigError, check_choice
from ditax.models.common.fields import known_fields

#: diffusers' ``LATENT_DOWNSAMPLE_FACTOR``: mel frames (and mel bins) per latent frame (bin)
LATENT_FACTOR = 4
#: the time axis is the spectrogram's height: "height" = causal in time
CAUSALITY_AXES = ("none", "width", "height", "width-compatibility")
NORM_TYPES = ("pixel", "group")
GROUPS = 32        # diffusers' fixed GroupNorm group count (norm_type="group")


@dataclass(frozen=True)
class LTX2AudioVAEConfig:
    """Fields follow diffusers' ``AutoencoderKLLTX2Audio`` config (``config.json``); defaults
    are diffusers' (= the public LTX-2 audio VAE)."""

    base_channels: int = 128
    output_channels: int = 2
    ch_mult: tuple[int, ...] = (1, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] | None = None
    in_channels: int = 2
    resolution: int = 256
    latent_channels: int = 8
    norm_type: str = "pixel"
    causality_axis: str = "height"
    dropout: float = 0.0
    mid_block_add_attention: bool = False
    sample_rate: int = 16000
    mel_hop_length: int = 160
    is_causal: bool = True
    mel_bins: int | None = 64
    double_z: bool = True

    @classmethod
    def from_diffusers(cls, cfg: dict) -> "LTX2AudioVAEConfig":
        """From a diffusers ``config.json`` dict; keys this port does not know are logged and
        ignored (``_class_name`` and the like silently)."""
        c = cls(**known_fields(cls, cfg, "LTX-2 audio VAE config"))
        c.validate()
        return c

    def validate(self) -> None:
        """Refuse what cannot build or what this port does not implement, naming the key."""
        check_choice("audio_vae causality_axis", self.causality_axis, CAUSALITY_AXES)
        check_choice("audio_vae norm_type", self.norm_type, NORM_TYPES)
        if not self.ch_mult or any(int(m) <= 0 for m in self.ch_mult) or self.base_channels <= 0:
            raise ConfigError(f"audio VAE: base_channels={self.base_channels}, ch_mult="
                              f"{list(self.ch_mult)} must be positive, with at least one level")
        if self.norm_type == "group":
            if self.causality_axis != "none":
                raise ConfigError(f"audio VAE: norm_type='group' with causality_axis="
                                  f"{self.causality_axis!r} cannot build (diffusers refuses "
                                  "causal resnets with GroupNorm); use norm_type='pixel' or "
                                  "causality_axis='none'")
            bad = [w for w in self.widths if w % GROUPS]
            if bad:
                raise ConfigError(f"audio VAE: norm_type='group' normalises {GROUPS} groups, "
                                  f"which do not divide the widths {bad}; change base_channels")
        if not self.double_z:
            raise ConfigError("audio VAE: double_z=false makes the encoder emit latent_channels "
                              "maps that diffusers then splits into half-width mean / log-variance;"
                              " ditax implements double_z=true (every public LTX-2 audio VAE)")
        if self.dropout:
            raise ConfigError(f"audio VAE: dropout={self.dropout} is not implemented (inference "
                              "ignores it; training would not); set dropout=0.0")
        for name in ("in_channels", "output_channels", "latent_channels", "num_res_blocks",
                     "sample_rate", "mel_hop_length", "resolution"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"audio VAE: {name}={getattr(self, name)} must be positive")
        if self.mel_bins is not None and self.mel_bins <= 0:
            raise ConfigError(f"audio VAE: mel_bins={self.mel_bins} must be positive (or null)")

    @property
    def widths(self) -> tuple[int, ...]:
        """Channels of each level, ``base_channels * ch_mult``."""
        return tuple(self.base_channels * m for m in self.ch_mult)

    @property
    def attention_resolutions(self) -> frozenset[int]:
        """The resolutions whose level blocks carry attention (diffusers keeps a set)."""
        return frozenset(self.attn_resolutions or ())

    @property
    def downsample_factor(self) -> int:
        """What the architecture divides time and mel bins by: 2 per level but the last."""
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def temporal_factor(self) -> int:
        """Mel frames per latent frame as diffusers counts them (``temporal_compression_ratio``)."""
        return LATENT_FACTOR

    @property
    def mel_factor(self) -> int:
        """Mel bins per latent bin as diffusers counts them (``mel_compression_ratio``)."""
        return LATENT_FACTOR

    @property
    def latent_mel_bins(self) -> int:
        """Latent bins of ``mel_bins`` (the pipeline's ``mel_bins // 4``; 64 → 16)."""
        if self.mel_bins is None:
            raise ConfigError("audio VAE: mel_bins is null; the pipeline needs the number of mel "
                              "bins (64 for LTX-2) in the audio_vae config.json")
        return self.mel_bins // self.mel_factor

    @property
    def latents_per_second(self) -> float:
        """Latent frames per second of audio (``sample_rate / mel_hop_length / 4``: 25 for
        LTX-2)."""
        return self.sample_rate / self.mel_hop_length / float(self.temporal_factor)


__all__ = ["CAUSALITY_AXES", "GROUPS", "LATENT_FACTOR", "LTX2AudioVAEConfig", "NORM_TYPES"]
