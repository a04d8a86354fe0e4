"""What ``ditax generate`` and ``ditax calibrate-cache`` do first, written once: the config
from the ``key=value`` overrides, ``--model demo`` as the shipped demo folder, the family of the
folder (its ``model_index.json`` ``_class_name``, :mod:`ditax.pipelines.family`) and the
request's defaults — per key the ``sample.*`` override or preset the user chose, else the
folder's ``ditax_sample.json``, else the family's. Reads only those small files (a hub id is
resolved here, as it would be next); a path that is no model folder falls back to the default
family's defaults and is reported after the request's own checks, by the family's preflight."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

from ditax.cli import model_arg


@dataclass(frozen=True)
class SampleRequest:
    """``cfg`` (the loaded config), ``given`` (the overrides as nested dicts), ``chosen`` (the
    ``sample`` keys the user set or the preset set), ``model`` (the path, ``demo`` resolved),
    ``root`` (the folder, None when not found), ``pipelines`` (its family's
    :class:`~ditax.pipelines.family.PipelineFamily`), ``defaults`` (the request's defaults)."""

    cfg: Any
    given: dict
    chosen: set
    model: str
    root: pathlib.Path | None
    pipelines: Any
    defaults: dict


def sample_request(model: str, overrides: list[str]) -> SampleRequest:
    """The config and defaults of a sampling command on ``model`` (module docstring)."""
    from ditax.config import load_config, parse_overrides
    from ditax.pipelines.family import folder_pipelines, sample_presets

    cfg = load_config(None, overrides)
    given = parse_overrides(overrides)
    s = cfg.sample
    presets = sample_presets(cfg.model.family) if s.preset else {}
    chosen = set(given.get("sample", {})) | set(presets.get(s.preset, {}))
    model = model_arg(model)       # 'demo': the shipped demo model
    root, pipelines = folder_pipelines(model)
    return SampleRequest(cfg, given, chosen, model, root, pipelines,
                         pipelines.request_defaults(root, s, chosen))


__all__ = ["SampleRequest", "sample_request"]
