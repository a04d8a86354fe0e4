"""ditax: Wan 2.1 / 2.2 text-to-video diffusion transformers in JAX.

Public surface (see DESIGN.md): ``load_transformer``, ``load_pipeline``, ``attention.attend``,
``load_config``, ``make_mesh``.
"""

from __future__ import annotations

from ditax import attention
from ditax.config import Config, ConfigError, load_config, validate
from ditax.parallel.mesh import make_mesh
from ditax.parallel.platform import target_platform

__version__ = "0.1.0"


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla", **kw):
    """Load a diffusers-format Wan transformer; see :func:`ditax.models.wan.loading.load_transformer`."""
    from ditax.models.wan.loading import load_transformer as _load

    return _load(path, dtype=dtype, mesh=mesh, attention=attention, **kw)


def load_pipeline(path, dtype: str = "float32", mesh=None, attention="xla", **kw):
    """Load a diffusers-format Wan text-to-video pipeline folder (or hub id)."""
    from ditax.pipelines.text_to_video import load_pipeline as _load

    return _load(path, dtype=dtype, mesh=mesh, attention=attention, **kw)


__all__ = ["attention", "Config", "ConfigError", "load_config", "validate", "make_mesh",
           "target_platform", "load_transformer", "load_pipeline", "__version__"]
