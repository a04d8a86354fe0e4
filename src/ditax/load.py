"""``ditax.load_transformer``: the library entry that picks the model family and reads ``config=``.

It stands above the config loader and the families, so neither has to reach the other: a
single-file checkpoint's ``config=`` (a preset name or a YAML path) is read here into its
model config (:func:`ditax.config.load_config`), and the family comes from that config's
``family`` or from the folder's ``config.json`` ``_class_name`` (the registry,
:mod:`ditax.models.registry`). The family's loader
(:meth:`ditax.models.base.ModelFamily.load_transformer`: the one loader,
:class:`ditax.models.common.loader.TransformerLoader`, with the family's data) then coerces
``attention=`` (a name or an ``AttentionConfig``), checks the model, attention and mesh once
and loads.
"""

from __future__ import annotations

import dataclasses
import os


def model_config(config, path):
    """The model config ``config=`` names for the single-file checkpoint ``path``: a preset
    name or YAML path (read by the config loader), or a family's model config as is."""
    from ditax.config import load_config, preset_names
    from ditax.errors import ConfigError

    if config is None:
        raise ConfigError(f"{path} is a single-file checkpoint without config.json; pass its "
                          f"architecture as config= (--config on the command line; a preset: "
                          f"{', '.join(preset_names())}; a YAML path; or a ditax model config "
                          f"such as WanConfig)")
    if isinstance(config, (str, os.PathLike)):
        return load_config(str(config)).model
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise ConfigError(f"config={config!r} is not a preset name, YAML path or model config")
    return config


def require(name: str, path, kwargs: dict, single: bool = False) -> None:
    """The capabilities loading ``path`` with ``kwargs`` asks of family ``name``, each
    undeclared one refused in one line (:func:`ditax.models.registry.require`) before any
    weights are read: a transformer loader, single files, 8-bit (``quantize=``), LoRA
    (``loras=``)."""
    from ditax.models import registry

    what = f"ditax.load_transformer({str(path)!r})"
    registry.require(name, "transformer", what, "load a folder of a family that has one")
    if single:
        registry.require(name, "single_file", what, "load a diffusers folder (config.json "
                         "beside the weights) instead")
    if kwargs.get("quantize") not in (None, "none"):
        registry.require(name, "quantize", f"{what} with quantize={kwargs['quantize']!r}",
                         "load it without quantize=")
    if kwargs.get("loras"):
        registry.require(name, "lora", f"{what} with loras=", "load it without loras=")


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str = "transformer", *, config=None, **kwargs):
    """Load a transformer — a diffusers folder (or pipeline folder / hub id), or one
    ``.safetensors`` file with ``config=`` — with its family's loader
    (:meth:`ditax.models.common.loader.TransformerLoader.load` lists every argument:
    ``loras``, ``lora_strict``, ``lora_mode``, ``quantize`` and model overrides such as
    ``remat="full"``).

    ``config``: the architecture of a single-file checkpoint — a preset name
    (``"wan2.1-t2v-1.3b"``), a YAML path or a model config; folders have their own
    ``config.json``.
    """
    from ditax.io.weights import is_single_file
    from ditax.models import registry
    from ditax.models.base import family_class, model_family

    if is_single_file(path):
        model = model_config(config, path)
        require(getattr(model, "family", registry.DEFAULT_FAMILY), path, kwargs, single=True)
        return model_family(model).load_transformer(path, dtype=dtype, mesh=mesh,
                                                    attention=attention, config=model, **kwargs)
    from ditax.io.files import read_model_json
    from ditax.io.hub import resolve_folder

    folder = resolve_folder(path, subfolder)
    cls = read_model_json(folder / "config.json", "transformer config").get("_class_name")
    name = registry.DEFAULT_FAMILY if cls is None else registry.spec_for_class(cls).name
    require(name, path, kwargs)
    return family_class(name).load_transformer(folder, dtype=dtype, mesh=mesh,
                                               attention=attention, subfolder=None,
                                               config=config, **kwargs)


__all__ = ["load_transformer", "model_config", "require"]
