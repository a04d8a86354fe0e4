"""Build the Flux transformer: abstractly, randomly initialised, and its parameter shardings
(the table's logical axes, :func:`ditax.models.loaded.param_shardings`). The configs are the
caller's, checked once at its entry point (:func:`ditax.models.flux.config.check_transformer`).
"""

from __future__ import annotations

from flax import nnx

from ditax.attention.config import AttentionConfig
from ditax.models import loaded
from ditax.models.flux.config import FluxConfig
from ditax.models.flux.convert import param_axes
from ditax.models.flux.transformer import FluxTransformer


def param_shardings(state, cfg: FluxConfig, mesh):
    """NamedShardings (same tree as ``state``) from the table's logical axes."""
    return loaded.param_shardings(state, param_axes(cfg), mesh)


def abstract_model(cfg: FluxConfig, attention: AttentionConfig | None = None, mesh=None):
    """The model with ``ShapeDtypeStruct`` parameters (nothing allocated)."""
    return nnx.eval_shape(lambda: FluxTransformer(cfg, attention, mesh, rngs=nnx.Rngs(0)))


def init_model(cfg: FluxConfig, attention: AttentionConfig | None = None, mesh=None,
               seed: int = 0) -> FluxTransformer:
    """Randomly initialised model; with a mesh, parameters are created already sharded."""
    return loaded.init_module(lambda mesh, rngs: FluxTransformer(cfg, attention, mesh, rngs=rngs),
                              mesh, seed, lambda state: param_shardings(state, cfg, mesh))


__all__ = ["abstract_model", "init_model", "param_shardings"]
