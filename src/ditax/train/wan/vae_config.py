"""Config of ``ditax train-vae``: the Wan VAE's architecture, clip data, losses, optimiser.

A :class:`VAETrainConfig` is read by the one config loader
(:func:`ditax.config.loader.load_dataclass`): a YAML file (optional) plus ``key=value``
overrides, through pydantic (types, ``Literal`` choices, unknown keys refused), then
:func:`check_vae_training` for the rules beyond types. ``vae.*`` are the diffusers
``AutoencoderKLWan`` config names (:class:`~ditax.models.vae.wan.WanVAEConfig`), so the folder
the run writes is loadable by diffusers as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ditax.config.loader import load_dataclass, to_dict
from ditax.errors import ConfigError
from ditax.models.vae.wan.config import WanVAEConfig
from ditax.train.vae_config import DEFAULTS as COMMON_DEFAULTS
from ditax.train.vae_config import VAEDataConfig, VAELossConfig, VAERunConfig, check_vae_common


@dataclass(frozen=True)
class VAETrainConfig(VAERunConfig):
    vae: WanVAEConfig = field(default_factory=WanVAEConfig)


# what a run gets for keys nobody set: a small VAE (the dataclass defaults are the full Wan 2.1
# VAE and the transformer's optimiser), applied key by key so that one override keeps the rest
DEFAULTS: dict[str, Any] = {"vae.base_dim": 16, "vae.num_res_blocks": 1, **COMMON_DEFAULTS}


def check_vae_training(c: VAETrainConfig, require_source: bool = True) -> None:
    """Raise :class:`ConfigError` for a VAE training config that cannot run
    (``require_source=False``: every rule but a set ``data.source``, for a listing)."""
    try:
        c.vae.validate()
    except NotImplementedError as e:
        raise ConfigError(str(e)) from None
    check_vae_common(c, c.vae.spatial_factor, c.vae.temporal_factor, require_source)


def load_vae_config(path: str | None = None, overrides: list[str] | None = None,
                    require_source: bool = True, **values) -> VAETrainConfig:
    """A YAML file (optional), then ``values`` (dotted keys, Python values), then the
    ``key=value`` texts → a checked :class:`VAETrainConfig` (``require_source``: see
    :func:`check_vae_training`)."""
    cfg = load_dataclass(VAETrainConfig, path, overrides, defaults=DEFAULTS, values=values)
    check_vae_training(cfg, require_source)
    return cfg


def vae_config_dict(c: VAETrainConfig) -> dict:
    """The config as plain nested dicts (YAML / JSON ready)."""
    return to_dict(c)


__all__ = ["VAETrainConfig", "VAEDataConfig", "VAELossConfig", "load_vae_config",
           "check_vae_training", "vae_config_dict"]
