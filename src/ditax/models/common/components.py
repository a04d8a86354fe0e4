"""A pipeline component's folder (a VAE, the vocoder, the latent upsampler): where it is and
its ``config.json``, which must name one of the component's diffusers classes — the first
step of every component loader (:mod:`ditax.models.vae`, :mod:`ditax.models.ltx2`)."""

from __future__ import annotations

import pathlib

from ditax.errors import WeightError
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder


def component_config(path, subfolder: str, what: str, class_names: tuple[str, ...],
                     fix: str) -> tuple[pathlib.Path, dict]:
    """``(folder, config.json dict)`` of the component at ``path`` (its folder, or a pipeline
    folder's ``subfolder``, or a hub id when online); a config without ``_class_name`` is
    taken as ``class_names[0]``, another class is a :class:`~ditax.errors.WeightError` naming
    it and where to point instead (``fix``). ``what``: the config in messages."""
    folder = resolve_folder(path, subfolder)
    raw = read_model_json(folder / "config.json", what)
    name = raw.get("_class_name", class_names[0])
    if name not in class_names:
        raise WeightError(f"{folder}: config.json is a {name!r}, not an {class_names[0]!r}; "
                          f"point at {fix}")
    return folder, raw


__all__ = ["component_config"]
