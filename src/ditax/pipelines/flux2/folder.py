"""What a FLUX.2 pipeline folder is, read from its small JSON files before any weights: its class
and kind (dev, klein base, klein distilled), its component folders, its size grid.

``Flux2Pipeline`` (FLUX.2 dev: Mistral-3 text encoder, embedded guidance) and
``Flux2KleinPipeline`` (klein: Qwen3 text encoder; ``is_distilled`` in ``model_index.json``
says whether it is step-distilled, run without CFG, or a base model, run with true CFG) hold
``tokenizer/``, ``text_encoder/``, ``transformer/`` (``Flux2Transformer2DModel``), ``vae/``
(``AutoencoderKLFlux2``) and ``scheduler/``.
"""

from __future__ import annotations

import pathlib

from ditax.errors import ConfigError
from ditax.pipelines.flux2.request import DEV, KLEIN_BASE, KLEIN_DISTILLED
from ditax.pipelines.folders import folder_class

DEV_CLASS, KLEIN_CLASS = "Flux2Pipeline", "Flux2KleinPipeline"
PIPELINE_CLASSES = (DEV_CLASS, KLEIN_CLASS)
COMPONENTS = ("tokenizer", "text_encoder", "transformer", "vae", "scheduler")
PATCH = 2


def folder_kind(root) -> str:
    """``dev``, ``klein-base`` or ``klein-distilled`` of pipeline folder ``root``, with every
    component folder present; :class:`ConfigError` naming what is wrong."""
    root = pathlib.Path(root)
    cls, index = folder_class(root, PIPELINE_CLASSES, "FLUX.2", COMPONENTS)
    if cls == DEV_CLASS:
        return DEV
    distilled = index.get("is_distilled", False)
    if not isinstance(distilled, bool):
        raise ConfigError(f"{root / 'model_index.json'}: is_distilled={distilled!r} must be "
                          f"true or false")
    return KLEIN_DISTILLED if distilled else KLEIN_BASE


def vae_factor(vae_config: dict) -> int:
    """The VAE's spatial factor: ``2 ** (len(block_out_channels) - 1)`` (8 for FLUX.2's)."""
    return 2 ** (len(vae_config.get("block_out_channels", (0,) * 4)) - 1)


def size_grid(root) -> int:
    """The sizes folder ``root`` makes are multiples of this: the VAE's factor x the 2x2
    patch (16 for FLUX.2)."""
    from ditax.io.files import read_model_json

    vae = read_model_json(pathlib.Path(root) / "vae" / "config.json", "VAE config")
    return vae_factor(vae) * PATCH


__all__ = ["COMPONENTS", "DEV_CLASS", "KLEIN_CLASS", "PIPELINE_CLASSES", "folder_kind",
           "size_grid", "vae_factor"]
