"""Build the Wan transformer: abstractly, randomly initialised, and its parameter shardings.

With a mesh, parameters are created straight into their NamedShardings (the table's logical
axes through :func:`ditax.parallel.rules.param_spec`). The configs are the caller's, checked
once at its entry point (:func:`ditax.models.wan.config.check_transformer`).
"""

from __future__ import annotations

from typing import Any

from flax import nnx

from ditax.attention.config import AttentionConfig
from ditax.models import loaded
from ditax.models.wan import convert
from ditax.models.wan.config import WanConfig
from ditax.models.wan.transformer import WanTransformer


def param_shardings(state, cfg: WanConfig, mesh) -> Any:
    """NamedShardings (same tree as ``state``) from the table's logical axes
    (:func:`ditax.models.loaded.param_shardings`; other variables replicated)."""
    return loaded.param_shardings(state, convert.config_param_axes(cfg), mesh)


def abstract_model(cfg: WanConfig, attention: AttentionConfig | None = None, mesh=None):
    """The model with ``ShapeDtypeStruct`` parameters (nothing allocated)."""
    return nnx.eval_shape(lambda: WanTransformer(cfg, attention, mesh, rngs=nnx.Rngs(0)))


def init_model(cfg: WanConfig, attention: AttentionConfig | None = None, mesh=None,
               seed: int = 0) -> WanTransformer:
    """Randomly initialised model; with a mesh, parameters are created already sharded."""
    return loaded.init_module(lambda mesh, rngs: WanTransformer(cfg, attention, mesh, rngs=rngs),
                              mesh, seed, lambda state: param_shardings(state, cfg, mesh))


__all__ = ["abstract_model", "init_model", "param_shardings"]
