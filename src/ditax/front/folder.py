"""What every entry that samples a model folder does first (``ditax generate``, ``ditax
calibrate-cache``, ``ditax serve``, :func:`ditax.front.resolve`), written once, in this order:

1. the model folder: ``demo`` / ``flux-demo`` as the shipped folders (:func:`model_path`), a
   hub id resolved (or read from the cache), and a path that
   is no pipeline folder refused in one line naming what it is or lacks
   (:func:`ditax.pipelines.family.model_folder`) — before any family's rule;
2. its family, from ``model_index.json``'s ``_class_name``;
3. the config of that family, loaded and type-checked once: its ``model.*`` keys (another
   family's refused naming the folder's), its sample presets, and under the overrides the
   folder's own transformer fields (:meth:`ditax.models.base.ModelFamily.folder_config`), so
   the rules the caller's :func:`ditax.config.validate` applies see the folder's heads;
4. the request's defaults — per key the ``sample.*`` override or preset the user chose, else
   the folder's ``ditax_sample.json``, else the family's;
5. (:func:`check_sizes`, once the request is built) its sizes on the folder's one size rule.

Reads only those small JSON files (no weights)."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

# the names a model argument takes for the models shipped in the package -> the function of
# :mod:`ditax.demo` that returns the folder (one entry a shipped model, whatever its family)
SHIPPED_MODELS = {"demo": "model_path", "demo-causal": "causal_model_path",
                  "flux-demo": "flux_model_path"}


def model_path(text: str) -> str:
    """A model argument as a path: ``demo`` is the shipped Wan demo folder, ``demo-causal``
    its causal student, ``flux-demo`` the shipped small Flux (:data:`SHIPPED_MODELS`; every entry that takes a model accepts them the
    same way), anything else is returned as given."""
    if text not in SHIPPED_MODELS:
        return text
    import ditax.demo

    return str(getattr(ditax.demo, SHIPPED_MODELS[text])())


@dataclass(frozen=True)
class FolderRequest:
    """``cfg`` (the loaded config, ``model`` section = the folder's family with the folder's
    transformer fields under the overrides), ``given`` (the overrides as nested dicts),
    ``chosen`` (the ``sample`` keys the user set or the preset set), ``model`` (the path,
    ``demo`` / ``flux-demo`` resolved), ``root`` (the resolved folder), ``pipelines`` (its
    family's :class:`~ditax.pipelines.family.PipelineFamily`), ``defaults`` (the request's
    defaults)."""

    cfg: Any
    given: dict
    chosen: set
    model: str
    root: pathlib.Path | None
    pipelines: Any
    defaults: dict


def folder_model_fields(family: str, root: pathlib.Path) -> dict:
    """The model config fields folder ``root`` fixes, by its family's runtime interface
    (``{}`` for a family that declares none)."""
    from ditax.models import registry

    spec = registry.spec(family)
    return {} if spec.family is None else spec.family_class().folder_config(root)


def folder_request(model: str, overrides: list[str]) -> FolderRequest:
    """The config and defaults of a sampling command on ``model`` (module docstring)."""
    from ditax.config import load_config, parse_overrides
    from ditax.pipelines.family import (family_name, model_folder, pipeline_class,
                                        pipelines_of, sample_presets)

    model = model_path(model)       # 'demo' / 'flux-demo': the shipped folders
    root = model_folder(model, "--model")
    family = family_name(root)
    pipelines = pipelines_of(family)
    origin = f"{model} is a {pipeline_class(root) or family + ' pipeline'} folder"
    fields = folder_model_fields(family, root)
    cfg = load_config(None, overrides, family=family, model=fields, origin=origin)
    given = parse_overrides(overrides, family=family, model=fields, origin=origin)
    s = cfg.sample
    presets = sample_presets(family) if s.preset else {}
    chosen = set(given.get("sample", {})) | set(presets.get(s.preset, {}))
    return FolderRequest(cfg, given, chosen, model, root, pipelines,
                         pipelines.request_defaults(root, s, chosen))


def check_sizes(req: FolderRequest, call: dict) -> None:
    """The call's sizes and frames on the folder's one rule (its family's
    :meth:`~ditax.models.base.ModelFamily.size_rule`: the folder's VAE and the transformer's
    patch under the config's model fields), before any weights:
    :class:`~ditax.errors.RequestError` naming the value (the same words for ``ditax
    generate`` and ``ditax serve``) and the nearest valid ones. Sizes not given (None) are
    the pipeline's to choose."""
    from ditax.models import registry

    spec = registry.spec(req.pipelines.name)
    if spec.family is None:
        return
    rule = spec.family_class().size_rule(req.root, req.cfg.model)
    rule.check(call.get("height"), call.get("width"), call.get("num_frames"))


__all__ = ["FolderRequest", "SHIPPED_MODELS", "check_sizes", "folder_model_fields",
           "folder_request", "model_path"]
