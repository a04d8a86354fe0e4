"""What every family's ``ditax train-vae`` config shares: the clip data, the losses, the run's
keys (:class:`VAERunConfig`), and the rules on them beyond types (:func:`check_vae_common`); a
family's config adds its ``vae.*`` (the Wan one: :mod:`ditax.train.wan.vae_config`, the Flux
one: :mod:`ditax.train.flux.vae`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ditax.config.training import CheckpointConfig, OptimConfig, check_checkpoint, check_optim
from ditax.errors import ConfigError
from ditax.numbers import check_numbers


@dataclass(frozen=True)
class VAEDataConfig:
    """Clips for VAE training: a folder of videos (``.mp4`` …, as ``ditax preprocess`` reads)
    scaled to ``height x width``, ``num_frames`` read per clip. Each training sample is a
    random window of ``crop_frames`` frames (``temporal_factor * k + 1``) and a random
    ``crop`` x ``crop`` square (``0``: the whole frame). With probability ``crop_focus`` the
    square is instead the busiest (largest pixel standard deviation) of ``crop_candidates``
    random squares of that window: foreground oversampling, for clips whose content covers a
    small part of the frame (random crops of them are mostly background). The last
    ``eval_clips`` clips (sorted by name) are held out and only evaluated, whole."""

    source: str = ""
    num_frames: int = 17
    height: int = 64
    width: int = 64
    crop_frames: int = 5
    crop: int = 0
    crop_focus: float = 0.0            # probability of the busiest of crop_candidates squares
    crop_candidates: int = 4
    eval_clips: int = 16
    max_clips: int = 0                 # read only the first this many clips (0: all)


@dataclass(frozen=True)
class VAELossConfig:
    """``l1 * mean|x̂ - x| + l2 * mean (x̂ - x)^2 + kl * KL(q(z|x) || N(0, 1))`` (per element
    means, pixels in [-1, 1]; the KL is the mean over latent elements) ``+ colour * mean
    |B(x̂ - x)|``, ``B`` the means over ``colour_block`` x ``colour_block`` pixel squares: the
    error of a region's colour, which a small object's edges do not dilute (0: off). Training
    starts from a posterior of log-variance ``init_logvar``."""

    l1: float = 1.0
    l2: float = 1.0
    kl: float = 1e-6
    colour: float = 0.0
    colour_block: int = 4          # side of the pixel squares of the colour term
    init_logvar: float = -8.0      # initial posterior log-variance (bias of quant_conv)


@dataclass(frozen=True)
class VAERunConfig:
    """A family's ``ditax train-vae`` config: its ``vae.*`` (a subclass declares ``vae`` with
    the family's VAE config class; the field stays first) and the keys every family's run has
    (a subclass may give ``batch_size`` and ``output_dir`` its own defaults)."""

    vae: Any
    data: VAEDataConfig = field(default_factory=VAEDataConfig)
    loss: VAELossConfig = field(default_factory=VAELossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    steps: int = 1000
    batch_size: int = 4
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0              # 0: evaluate only at the end
    output_dir: str = "out/vae"
    init_from: str = ""              # a diffusers VAE folder to start from ("" = random init)


# what a run gets for keys nobody set besides the family's own: the VAE's optimiser (the
# dataclass defaults are the transformer's), applied key by key
DEFAULTS = {"optim.learning_rate": 1e-3, "optim.weight_decay": 0.0, "checkpoint.every": 200}


def check_vae_common(c, spatial: int, temporal: int = 1, require_source: bool = True) -> None:
    """Raise :class:`ConfigError` for a VAE training config ``c`` (a family's, with ``data``,
    ``loss``, ``optim``, ``checkpoint``, ``steps`` …) that cannot run with a VAE of these
    factors (``require_source=False``: every rule but a set ``data.source``, for a listing)."""
    check_numbers(c)                    # every float finite, every int in range
    d, tf, sf = c.data, temporal, spatial
    if require_source and not d.source:
        raise ConfigError("data.source is empty: set it to a folder of clips, e.g. "
                          "data.source=demo_out/clips")
    for name in ("num_frames", "crop_frames"):
        n = getattr(d, name)
        if n < 1 or (n - 1) % tf:
            raise ConfigError(f"data.{name}={n} must be of the form {tf}k+1 for this VAE "
                              f"(temporal factor {tf}), e.g. {tf + 1} or {4 * tf + 1}")
    if d.crop_frames > d.num_frames:
        raise ConfigError(f"data.crop_frames={d.crop_frames} exceeds data.num_frames="
                          f"{d.num_frames}; lower it")
    for name in ("height", "width"):
        if getattr(d, name) < sf or getattr(d, name) % sf:
            raise ConfigError(f"data.{name}={getattr(d, name)} must be a positive multiple of "
                              f"the VAE's spatial factor {sf}")
    if d.crop and (d.crop % sf or d.crop > min(d.height, d.width)):
        raise ConfigError(f"data.crop={d.crop} must be a multiple of {sf} no larger than "
                          f"min(height, width)={min(d.height, d.width)}, or 0 for whole frames")
    if not 0.0 <= d.crop_focus <= 1.0:
        raise ConfigError(f"data.crop_focus={d.crop_focus} must be a probability in [0, 1] "
                          "(0: uniform random crops)")
    if d.crop_candidates < 1:
        raise ConfigError(f"data.crop_candidates={d.crop_candidates} must be >= 1")
    if d.crop_focus and not d.crop:
        raise ConfigError(f"data.crop_focus={d.crop_focus} needs data.crop > 0 (whole frames "
                          "have nothing to focus); set data.crop or data.crop_focus=0")
    if d.max_clips < 0:
        raise ConfigError(f"data.max_clips={d.max_clips} must be >= 0 (0: every clip)")
    if d.eval_clips < 1:
        raise ConfigError(f"data.eval_clips={d.eval_clips} must be >= 1 (held-out clips for "
                          "the PSNR)")
    for k in ("l1", "l2", "kl"):
        if getattr(c.loss, k) < 0:
            raise ConfigError(f"loss.{k}={getattr(c.loss, k)} must be >= 0")
    if c.loss.colour < 0:
        raise ConfigError(f"loss.colour={c.loss.colour} must be >= 0 (0: no colour term)")
    side = d.crop or min(d.height, d.width)
    if c.loss.colour and (c.loss.colour_block < 1 or d.height % c.loss.colour_block
                          or d.width % c.loss.colour_block or side % c.loss.colour_block):
        raise ConfigError(f"loss.colour_block={c.loss.colour_block} must divide data.height, "
                          f"data.width and data.crop ({d.height}, {d.width}, {d.crop}); e.g. 4")
    if c.loss.l1 == 0 and c.loss.l2 == 0:
        raise ConfigError("loss.l1 and loss.l2 are both 0: nothing to reconstruct; set one > 0")
    check_optim(c.optim)
    check_checkpoint(c.checkpoint)
    for k in ("steps", "batch_size", "log_every"):
        if getattr(c, k) < 1:
            raise ConfigError(f"{k}={getattr(c, k)} must be >= 1")
    if c.eval_every < 0:
        raise ConfigError(f"eval_every={c.eval_every} must be >= 0 (0: at the end only)")


__all__ = ["VAEDataConfig", "VAELossConfig", "VAERunConfig", "DEFAULTS", "check_vae_common"]
