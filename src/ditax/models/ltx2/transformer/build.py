"""Build the LTX-2 transformer: abstractly, randomly initialised, and its parameter shardings
(the table's logical axes, :func:`ditax.models.common.loaded.param_shardings`). The configs are
the caller's, checked once at its entry point (:func:`ditax.models.ltx2.config.check_transformer`).
"""

from __future__ import annotations

from ditax.models.common import loaded
from ditax.models.ltx2.transformer.convert import param_axes
from ditax.models.ltx2.transformer.model import LTX2Transformer

_BUILD = loaded.Builder(LTX2Transformer, param_axes)
param_shardings = _BUILD.param_shardings   # (state, cfg, mesh) -> NamedShardings
abstract_model = _BUILD.abstract_model     # (cfg, attention=None, mesh=None) -> abstract module
init_model = _BUILD.init_model             # (cfg, attention=None, mesh=None, seed=0) -> module

__all__ = ["abstract_model", "init_model", "param_shardings"]
