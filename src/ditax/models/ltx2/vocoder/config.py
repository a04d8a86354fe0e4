"""Shapes of LTX-2's vocoders in diffusers' config names: ``LTX2Vocoder`` (LTX-2.0: mel →
24 kHz waveform) and ``LTX2VocoderWithBWE`` (LTX-2.3 / 2.5: a 16 kHz vocoder, then a bandwidth
extender to 48 kHz).

``LTX2VocoderConfig()`` is LTX-2.0's vocoder: 128 input features (2 channels x 64 mel bins),
width 1024 halved at each of 5 transposed-conv upsamplers (x 6 5 2 2 2 = 240 samples a mel
frame: 10 ms at 24 kHz), three residual blocks per upsampler (kernels 3 / 7 / 11, dilations
1 / 3 / 5), leaky ReLU, tanh at the end. ``LTX2VocoderBWEConfig()`` is LTX-2.3's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ditax.errors import ConfigError, check_choice
from ditax.models.common.fields import known_fields

ACTIVATIONS = ("leaky_relu", "snake", "snakebeta")
FINAL_ACTIVATIONS = ("tanh", "clamp", None)
_RESNETS = dict(resnet_kernel_sizes=(3, 7, 11), resnet_dilations=((1, 3, 5),) * 3)


def _from_dict(cls, cfg: dict, what: str):
    c = cls(**known_fields(cls, cfg, f"{what} config"))
    c.validate()
    return c


@dataclass(frozen=True)
class LTX2VocoderConfig:
    """Fields follow diffusers' ``LTX2Vocoder`` config; defaults are diffusers' (= LTX-2.0)."""

    in_channels: int = 128
    hidden_channels: int = 1024
    out_channels: int = 2
    upsample_kernel_sizes: tuple[int, ...] = (16, 15, 8, 4, 4)
    upsample_factors: tuple[int, ...] = (6, 5, 2, 2, 2)
    resnet_kernel_sizes: tuple[int, ...] = _RESNETS["resnet_kernel_sizes"]
    resnet_dilations: tuple[tuple[int, ...], ...] = _RESNETS["resnet_dilations"]
    act_fn: str = "leaky_relu"
    leaky_relu_negative_slope: float = 0.1
    antialias: bool = False
    antialias_ratio: int = 2
    antialias_kernel_size: int = 12
    final_act_fn: str | None = "tanh"
    final_bias: bool = True
    output_sampling_rate: int = 24000

    @classmethod
    def from_diffusers(cls, cfg: dict) -> "LTX2VocoderConfig":
        """From a diffusers ``config.json`` dict; unknown keys are logged and ignored."""
        return _from_dict(cls, cfg, "LTX-2 vocoder")

    def validate(self, what: str = "vocoder") -> None:
        """Refuse what cannot build or what this port does not implement, naming the key."""
        n = len(self.upsample_factors)
        if n == 0 or len(self.upsample_kernel_sizes) != n:
            raise ConfigError(f"{what}: upsample_kernel_sizes={list(self.upsample_kernel_sizes)} "
                              f"and upsample_factors={list(self.upsample_factors)} must be "
                              "non-empty lists of one length (one per upsampler)")
        kernels = self.resnet_kernel_sizes
        if not kernels or len(self.resnet_dilations) != len(kernels):
            raise ConfigError(f"{what}: resnet_kernel_sizes={list(kernels)} and "
                              f"resnet_dilations={[list(d) for d in self.resnet_dilations]} need "
                              "one dilation list per kernel size")
        check_choice(f"{what} act_fn", self.act_fn, ACTIVATIONS)
        check_choice(f"{what} final_act_fn", self.final_act_fn, FINAL_ACTIVATIONS)
        if self.act_fn == "leaky_relu" and self.antialias:
            raise ConfigError(f"{what}: act_fn='leaky_relu' with antialias=true is not supported "
                              "(diffusers 0.42 nests the second activations' anti-alias filters "
                              "ever deeper there, a bug no public model has); use antialias=false "
                              "or act_fn='snakebeta'")
        for k, s in zip(self.upsample_kernel_sizes, self.upsample_factors):
            if s < 1 or k < s:
                raise ConfigError(f"{what}: an upsampler of kernel {k} and factor {s} cannot keep "
                                  "length x factor; each kernel must be >= its factor >= 1")
        if self.hidden_channels >> n < 1:
            raise ConfigError(f"{what}: hidden_channels={self.hidden_channels} halves {n} times to "
                              "nothing; raise it")
        if self.antialias or self.act_fn != "leaky_relu":
            r, k = self.antialias_ratio, self.antialias_kernel_size
            if r < 1 or k < r:
                raise ConfigError(f"{what}: antialias_ratio={r}, antialias_kernel_size={k}: the "
                                  "kernel must be at least the ratio (12 and 2 in LTX-2.3)")
        for name in ("in_channels", "out_channels", "output_sampling_rate"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{what}: {name}={getattr(self, name)} must be positive")

    @property
    def sample_rate(self) -> int:
        """Samples per second of the waveform (``output_sampling_rate``)."""
        return self.output_sampling_rate

    @property
    def upsample_factor(self) -> int:
        """Waveform samples per mel frame (the product of ``upsample_factors``; 240 for 2.0)."""
        return math.prod(self.upsample_factors)

    @property
    def output_width(self) -> int:
        """Channels after the last upsampler (``hidden_channels`` halved once per upsampler)."""
        return self.hidden_channels >> len(self.upsample_factors)


_BWE_PREFIX = "bwe_"


@dataclass(frozen=True)
class LTX2VocoderBWEConfig:
    """Fields follow diffusers' ``LTX2VocoderWithBWE`` config; defaults are diffusers' (=
    LTX-2.3 / 2.5): a 16 kHz snake-beta vocoder, a log-mel of its output (causal STFT of
    ``filter_length`` every ``hop_length`` samples, ``num_mel_channels`` bins), and a second
    vocoder (``bwe_*``) that turns that mel into the residual of a 3x resampled waveform."""

    in_channels: int = 128
    hidden_channels: int = 1536
    out_channels: int = 2
    upsample_kernel_sizes: tuple[int, ...] = (11, 4, 4, 4, 4, 4)
    upsample_factors: tuple[int, ...] = (5, 2, 2, 2, 2, 2)
    resnet_kernel_sizes: tuple[int, ...] = _RESNETS["resnet_kernel_sizes"]
    resnet_dilations: tuple[tuple[int, ...], ...] = _RESNETS["resnet_dilations"]
    act_fn: str = "snakebeta"
    leaky_relu_negative_slope: float = 0.1
    antialias: bool = True
    antialias_ratio: int = 2
    antialias_kernel_size: int = 12
    final_act_fn: str | None = None
    final_bias: bool = False
    bwe_in_channels: int = 128
    bwe_hidden_channels: int = 512
    bwe_out_channels: int = 2
    bwe_upsample_kernel_sizes: tuple[int, ...] = (12, 11, 4, 4, 4)
    bwe_upsample_factors: tuple[int, ...] = (6, 5, 2, 2, 2)
    bwe_resnet_kernel_sizes: tuple[int, ...] = _RESNETS["resnet_kernel_sizes"]
    bwe_resnet_dilations: tuple[tuple[int, ...], ...] = _RESNETS["resnet_dilations"]
    bwe_act_fn: str = "snakebeta"
    bwe_leaky_relu_negative_slope: float = 0.1
    bwe_antialias: bool = True
    bwe_antialias_ratio: int = 2
    bwe_antialias_kernel_size: int = 12
    bwe_final_act_fn: str | None = None
    bwe_final_bias: bool = False
    filter_length: int = 512
    hop_length: int = 80
    window_length: int = 512
    num_mel_channels: int = 64
    input_sampling_rate: int = 16000
    output_sampling_rate: int = 48000

    @classmethod
    def from_diffusers(cls, cfg: dict) -> "LTX2VocoderBWEConfig":
        """From a diffusers ``config.json`` dict; unknown keys are logged and ignored."""
        return _from_dict(cls, cfg, "LTX-2 vocoder with BWE")

    def stage(self, bwe: bool) -> LTX2VocoderConfig:
        """The first vocoder's config (``bwe=False``; it writes ``input_sampling_rate``) or the
        bandwidth extender's (``bwe=True``, from the ``bwe_*`` fields)."""
        names = [f.name for f in dataclasses.fields(LTX2VocoderConfig)
                 if f.name != "output_sampling_rate"]
        prefix = _BWE_PREFIX if bwe else ""
        return LTX2VocoderConfig(
            **{n: getattr(self, prefix + n) for n in names},
            output_sampling_rate=self.output_sampling_rate if bwe else self.input_sampling_rate)

    def validate(self) -> None:
        """Both vocoders' checks, then what makes their outputs add up (diffusers would fail
        there with a shape mismatch), naming the keys."""
        self.stage(False).validate("vocoder")
        self.stage(True).validate("bwe vocoder")
        if self.output_sampling_rate % self.input_sampling_rate:
            raise ConfigError(f"vocoder with BWE: output_sampling_rate={self.output_sampling_rate}"
                              f" must be a multiple of input_sampling_rate="
                              f"{self.input_sampling_rate} (the resampler's integer ratio)")
        if self.window_length != self.filter_length or self.hop_length < 1:
            raise ConfigError(f"vocoder with BWE: window_length={self.window_length} must equal "
                              f"filter_length={self.filter_length} (and hop_length="
                              f"{self.hop_length} be positive) for the mel to have one frame a hop")
        if self.bwe_in_channels != self.out_channels * self.num_mel_channels:
            raise ConfigError(f"vocoder with BWE: bwe_in_channels={self.bwe_in_channels} must be "
                              f"out_channels x num_mel_channels = {self.out_channels} x "
                              f"{self.num_mel_channels}")
        per_frame = self.hop_length * self.ratio
        if math.prod(self.bwe_upsample_factors) != per_frame:
            raise ConfigError(f"vocoder with BWE: bwe_upsample_factors multiply to "
                              f"{math.prod(self.bwe_upsample_factors)}, but a mel frame of "
                              f"{self.hop_length} samples resampled x{self.ratio} is {per_frame}")
        if self.bwe_out_channels != self.out_channels:
            raise ConfigError(f"vocoder with BWE: bwe_out_channels={self.bwe_out_channels} must "
                              f"equal out_channels={self.out_channels} (residual + resampled)")

    @property
    def ratio(self) -> int:
        """Output samples per input sample (48 kHz / 16 kHz = 3)."""
        return self.output_sampling_rate // self.input_sampling_rate

    @property
    def sample_rate(self) -> int:
        """Samples per second of the final waveform (``output_sampling_rate``)."""
        return self.output_sampling_rate

    @property
    def upsample_factor(self) -> int:
        """Final waveform samples per input mel frame (160 x 3 = 480 for LTX-2.3)."""
        return math.prod(self.upsample_factors) * self.ratio


__all__ = ["ACTIVATIONS", "FINAL_ACTIVATIONS", "LTX2VocoderBWEConfig", "LTX2VocoderConfig"]
