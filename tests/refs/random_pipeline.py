"""The demo's random Wan pipeline folder (:func:`ditax.demo.folders.build_pipeline_folder`),
built once per test process and copied for each module that asks.

The folder is seeded (tokenizer, UMT5, VAE and transformer weights), so a copy is the folder a
fresh build writes; building it is ~4 CPU s (mostly the VAE's eager init, one compile per
parameter shape), a copy a few milliseconds. Each caller gets its own copy, so a module may edit
its folder (a config, a truncated weight file) without touching another's.
"""

from __future__ import annotations

import atexit
import functools
import pathlib
import shutil
import tempfile


@functools.lru_cache(maxsize=None)
def _built() -> pathlib.Path:
    from ditax.demo.folders import build_pipeline_folder

    root = pathlib.Path(tempfile.mkdtemp(prefix="ditax_random_pipeline_"))
    atexit.register(shutil.rmtree, root, True)
    return build_pipeline_folder(root / "pipeline")


def random_pipeline_folder(dest) -> pathlib.Path:
    """A copy of the random pipeline folder at ``dest`` (which must not exist yet)."""
    dest = pathlib.Path(dest)
    shutil.copytree(_built(), dest)
    return dest


def folder_fields(folder, preset: str = "tiny") -> list[str]:
    """The ``model.KEY=VALUE`` overrides that make ``preset``'s model the one of ``folder``
    (its family's :meth:`folder_config`, only the values that differ), for ``load_config``."""
    import json

    from ditax.config import load_config
    from ditax.models.base import family_class

    base = load_config(preset, []).model
    return [f"model.{k}={json.dumps(list(v) if isinstance(v, tuple) else v)}"
            for k, v in family_class(base.family).folder_config(folder).items()
            if getattr(base, k) != v]
