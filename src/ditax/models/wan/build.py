"""Build the Wan transformer: abstractly, randomly initialised, and its parameter shardings.

With a mesh, parameters are created straight into their NamedShardings (the table's logical
axes through :func:`ditax.parallel.rules.param_spec`). The configs are the caller's, checked
once at its entry point (:func:`ditax.models.wan.config.check_transformer`).
"""

from __future__ import annotations

from ditax.models.common import loaded
from ditax.models.wan import convert
from ditax.models.wan.transformer import WanTransformer

_BUILD = loaded.Builder(WanTransformer, convert.config_param_axes)
param_shardings = _BUILD.param_shardings   # (state, cfg, mesh) -> NamedShardings
abstract_model = _BUILD.abstract_model     # (cfg, attention=None, mesh=None) -> abstract module
init_model = _BUILD.init_model             # (cfg, attention=None, mesh=None, seed=0) -> module

__all__ = ["abstract_model", "init_model", "param_shardings"]
