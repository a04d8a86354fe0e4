"""Load the Flux transformer from a diffusers folder; the callable ``load_transformer`` returns.

The folder's ``config.json`` (``_class_name: FluxTransformer2DModel``) gives the
architecture; its safetensors (one file or a sharded index) are read through the table of
:mod:`.convert` with the strict key and shape checks of :mod:`ditax.io.convert` (one error
listing every missing / unexpected key, every tensor of the wrong shape) before any tensor is
read. With a mesh each parameter is created straight into its sharding, each device reading
its own slice.
"""

from __future__ import annotations

import logging
import pathlib
import time

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention.config import as_attention_config
from ditax.errors import ConfigError
from ditax.io.convert import load_params
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights, is_single_file
from ditax.models.flux.build import abstract_model
from ditax.models.flux.config import (CLASS_NAME, FluxConfig, check_transformer,
                                      same_architecture)
from ditax.models.flux.convert import param_axes, weight_table
from ditax.models import loaded
from ditax.models.loaded import LoadedTransformer, param_sharding
from ditax.parallel.mesh import MESH_AXES, check_mesh_axes

log = logging.getLogger(__name__)


def read_config(folder) -> dict:
    """``folder/config.json``, which must describe a ``FluxTransformer2DModel``."""
    cfg = read_model_json(pathlib.Path(folder) / "config.json", "transformer config")
    cls = cfg.get("_class_name")
    if cls != CLASS_NAME:
        raise ConfigError(f"{folder}/config.json is a {cls}, not a {CLASS_NAME}")
    return cfg


def load_weights_into(model_abs, source, cfg: FluxConfig, mesh=None):
    """Fill an abstract model's parameters from a diffusers safetensors folder (or file);
    with a mesh, each parameter is read slice by slice straight into its NamedSharding."""
    gdef, state = nnx.split(model_abs)
    state = load_params(weight_table(cfg), Weights.open(source), state,
                        jnp.dtype(cfg.param_dtype), param_sharding(param_axes(cfg), mesh))
    return nnx.merge(gdef, state)


def check_architecture(cfg: FluxConfig, path) -> pathlib.Path:
    """The transformer folder at ``path`` if its config.json has ``cfg``'s architecture;
    else a :class:`ConfigError` listing every differing field and the ``model.X=...``
    overrides that would match (``init_from``, before anything compiles)."""
    folder = resolve_folder(path, "transformer")
    loaded.check_architecture(path, same_architecture(
        cfg, FluxConfig.from_diffusers(read_config(folder))))
    return folder


def check_folder(path, subfolder: str | None = "transformer") -> str:
    """Check a Flux transformer folder from config.json and the safetensors headers only
    (every key present, none unexpected, every shape right) for ``ditax convert``; returns a
    one-line summary, raises :class:`~ditax.errors.WeightError` naming what does not fit."""
    import math

    from ditax.io.convert import check_weights, param_shapes

    folder = resolve_folder(path, subfolder)
    cfg = FluxConfig.from_diffusers(read_config(folder))
    check_transformer(cfg)
    weights = Weights.open(folder)
    shapes = param_shapes(nnx.state(abstract_model(cfg)))
    check_weights(weight_table(cfg), weights, shapes)
    n = sum(math.prod(s) for s in shapes.values())
    return (f"{folder}: OK — {cfg.num_layers} double + {cfg.num_single_layers} single blocks, "
            f"D={cfg.inner_dim}, {cfg.num_attention_heads} heads x {cfg.attention_head_dim}, "
            f"{n / 1e9:.3f} B params, {len(weights)} tensors")


def _forward(gdef, state, x, text, pooled, t, img_ids, txt_ids, guidance, text_mask):
    return nnx.merge(gdef, state)(x, t, text, pooled_projections=pooled, img_ids=img_ids,
                                  txt_ids=txt_ids, guidance=guidance, text_mask=text_mask)


_forward_jit = jax.jit(_forward, static_argnums=0)


@jax.tree_util.register_pytree_node_class
class FluxTransformerModel(LoadedTransformer):
    """What ``ditax.load_transformer`` returns for a Flux folder: a jitted, mesh-aware callable
    in diffusers' argument order,

    ``tr(hidden_states [B, L, C_in], encoder_hidden_states [B, T, Dt], pooled_projections
    [B, Dp], timestep [B] in [0, 1], img_ids [L, n], txt_ids [T, n], guidance [B] | None)
    → [B, L, C_out]``, plus ``text_mask=[B, T]`` (optional, True = token).

    A pytree of its parameters (:class:`~ditax.models.loaded.LoadedTransformer`), so it
    composes with a user's ``jax.jit`` / ``jax.grad``.
    """

    def __call__(self, hidden_states, encoder_hidden_states, pooled_projections, timestep,
                 img_ids, txt_ids, guidance=None, text_mask=None):
        x, text = jnp.asarray(hidden_states), jnp.asarray(encoder_hidden_states)
        pooled = jnp.asarray(pooled_projections)
        img_ids, txt_ids = jnp.asarray(img_ids), jnp.asarray(txt_ids)
        t = jnp.asarray(timestep, jnp.float32)
        g = None if guidance is None else jnp.asarray(guidance, jnp.float32)
        mask = None if text_mask is None else jnp.asarray(text_mask, bool)
        self.module.check_inputs(x, t, text, pooled_projections=pooled, img_ids=img_ids,
                                 txt_ids=txt_ids, guidance=g, text_mask=mask)
        b = x.shape[0]
        t = jnp.broadcast_to(t, (b,))
        g = None if g is None else jnp.broadcast_to(g, (b,))
        args = [self._place(a) for a in (x, text, pooled, t)]
        return _forward_jit(self._gdef, self._state, *args, img_ids, txt_ids, self._place(g),
                            self._place(mask))


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str | None = "transformer", *, config=None, loras=None,
                     **model_overrides) -> FluxTransformerModel:
    """Load a Flux transformer from a diffusers folder (a ``transformer/`` folder with
    config.json + safetensors [+ index], a pipeline folder that has ``transformer/``, or a hub
    id when online).

    Args:
      dtype: parameter and compute dtype ("float32" | "bfloat16" | "float16").
      mesh: optional ``jax.sharding.Mesh`` with axes (data, fsdp, context, tensor).
      attention: a backend name or an :class:`~ditax.attention.config.AttentionConfig`.
      model_overrides: other :class:`FluxConfig` fields (e.g. ``remat="full"``).

    The model, attention and mesh are checked here, once, before anything is built.
    """
    t0 = time.perf_counter()
    if is_single_file(path):
        raise ConfigError(f"{path}: single-file Flux checkpoints (BFL / ComfyUI names) are not "
                          f"read yet; use a diffusers folder with config.json")
    if config is not None:
        raise ConfigError(f"config= is for single-file checkpoints; {path} is read with its own "
                          f"config.json (pass model overrides as keywords instead)")
    if loras:
        raise ConfigError("loras=: LoRA files are not read for Flux yet; load without loras")
    source = resolve_folder(path, subfolder)
    cfg = FluxConfig.from_diffusers(read_config(source), param_dtype=dtype, dtype=dtype,
                                    **model_overrides)
    acfg = as_attention_config(attention)
    check_mesh_axes(mesh)
    check_transformer(cfg, acfg, None if mesh is None else
                      {a: int(mesh.shape[a]) for a in MESH_AXES})
    model = load_weights_into(abstract_model(cfg, acfg, mesh), source, cfg, mesh)
    log.info("loaded %s (%d + %d layers, D=%d) in %.1fs", source, cfg.num_layers,
             cfg.num_single_layers, cfg.inner_dim, time.perf_counter() - t0)
    return FluxTransformerModel(model)


__all__ = ["FluxTransformerModel", "load_transformer", "load_weights_into", "read_config",
           "check_architecture", "check_folder"]
