"""Wan's size rule (:meth:`ditax.models.base.ModelFamily.size_rule`): sides multiples of the
VAE's spatial factor times the transformer's patch (Wan 2.1: 8 x 2 = 16; Wan 2.2 TI2V's 16x
VAE: 32; the shipped demo's 4x VAE and 4x4 patch: 16), ``4k+1`` frames (the VAE's temporal
factor, the first frame alone). Reads only the folder's small config files."""

from __future__ import annotations

import math
import pathlib

from ditax.errors import ConfigError
from ditax.models.size_rule import SizeRule

DEFAULT_PATCH = (1, 2, 2)


def folder_vae(root):
    """``root/vae/config.json``'s Wan VAE config; None when the folder has none (a hub id) or
    its config is not a Wan VAE's (the loaders then name the problem)."""
    from ditax.io.files import read_model_json
    from ditax.models.vae.wan.config import WanVAEConfig

    f = pathlib.Path(root) / "vae" / "config.json" if root is not None else None
    raw = read_model_json(f, "vae/config.json") if f and f.is_file() else None
    if isinstance(raw, dict) and raw.get("_class_name", "AutoencoderKLWan") == "AutoencoderKLWan":
        try:
            return WanVAEConfig.from_diffusers(raw)
        except (ConfigError, TypeError, ValueError):
            return None
    return None


def folder_patch(family: str, root):
    """The ``patch_size`` of ``root/transformer/config.json`` (one of the family's transformer
    classes); None when there is none."""
    from ditax.models.base import ModelFamily
    from ditax.models.registry import spec

    raw = ModelFamily.transformer_json(root, spec(family).transformer_classes) if root else None
    patch = (raw or {}).get("patch_size")
    return tuple(patch) if isinstance(patch, (list, tuple)) and len(patch) == 3 else None


def size_rule(family: str, root=None, model=None) -> SizeRule:
    """The rule of folder ``root`` (its VAE, its transformer's patch; None: no folder) under
    model config ``model`` (its ``patch_size`` over the folder's; its ``vae`` preset where the
    folder has no VAE config; None: Wan 2.1's VAE, the 1x2x2 patch)."""
    from ditax.models.vae.wan.config import vae_preset

    vae = folder_vae(root) or vae_preset(getattr(model, "vae", None) or "wan2.1")
    patch = tuple(getattr(model, "patch_size", None) or folder_patch(family, root)
                  or DEFAULT_PATCH)
    sf, tf = vae.spatial_factor, vae.temporal_factor
    return SizeRule(family, sf * math.lcm(*patch[1:]), tf,
                    f"the VAE's {sf}x and the transformer's {patch[1]}x{patch[2]} patch",
                    f"the VAE's {tf}x in time, the first frame alone",
                    latent=(patch[0], patch[1], patch[2]))


__all__ = ["DEFAULT_PATCH", "folder_patch", "folder_vae", "size_rule"]
