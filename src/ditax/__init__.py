"""ditax: video and image diffusion transformers in JAX — Wan 2.1 / 2.2 (text-, image-,
control-to-video), LTX-2 (video with sound), FLUX.1 and FLUX.2 (images) — for inference,
training, distillation and serving, on one chip or a cluster.

Public surface (DESIGN.md "Public surface"): ``load_transformer`` → a :class:`Transformer`
(the shared base of every family's loaded transformer; the family comes from the folder),
``load_pipeline`` → the folder's pipeline (Wan: :class:`WanTextToVideo`,
:class:`WanImageToVideo` …; FLUX.1, FLUX.2, LTX-2: theirs), :mod:`ditax.front` (the one
request every entry makes: ``front.resolve`` / ``front.open``), ``attention``
(``attention.attend``) with :class:`AttentionConfig`, ``load_config`` → :class:`Config`,
``make_mesh``, and the errors a user can fix (:class:`DitaxError` and its kinds).

The names are the library's own objects (real signatures and docstrings), imported on first
use: ``import ditax`` does not start JAX, so the ``ditax`` command can choose the platform
before JAX starts and ``ditax --help`` stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ditax.errors import (AttentionUnavailable, ConfigError, DitaxError, ModelNotFound,
                          RequestError, WeightError)

__version__ = "0.1.0"

# public name -> the module that defines it (imported on first access)
_HOMES = {
    "load_transformer": "ditax.load",
    "Transformer": "ditax.models.common.loaded",
    "load_pipeline": "ditax.pipelines.load",
    "WanTextToVideo": "ditax.pipelines.wan.text_to_video",
    "WanImageToVideo": "ditax.pipelines.wan.image_to_video",
    "load_config": "ditax.config",
    "validate": "ditax.config",
    "Config": "ditax.config",
    "make_mesh": "ditax.parallel.mesh",
    "AttentionConfig": "ditax.attention.config",
    "target_platform": "ditax.parallel.platform",
}
# public name -> its name in its home module, where they differ
_NAMES = {"Transformer": "LoadedTransformer"}
_SUBMODULES = ("attention", "demo", "front")

if TYPE_CHECKING:  # what static tools see; at run time ``__getattr__`` imports on demand
    from ditax import attention, demo, front
    from ditax.attention.config import AttentionConfig
    from ditax.config import Config, load_config, validate
    from ditax.load import load_transformer
    from ditax.models.common.loaded import LoadedTransformer as Transformer
    from ditax.parallel.mesh import make_mesh
    from ditax.parallel.platform import target_platform
    from ditax.pipelines.wan.image_to_video import WanImageToVideo
    from ditax.pipelines.load import load_pipeline
    from ditax.pipelines.wan.text_to_video import WanTextToVideo


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), _NAMES.get(name, name))
    elif name in _SUBMODULES:
        value = importlib.import_module(f"ditax.{name}")
    else:
        raise AttributeError(f"module 'ditax' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = ["load_transformer", "Transformer", "load_pipeline", "WanTextToVideo",
           "WanImageToVideo", "attention", "front",
           "AttentionConfig", "load_config", "validate", "Config", "make_mesh", "target_platform",
           "DitaxError", "ConfigError", "RequestError", "WeightError", "ModelNotFound",
           "AttentionUnavailable", "__version__"]
