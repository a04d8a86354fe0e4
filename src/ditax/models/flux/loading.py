"""Load the Flux transformer from a diffusers folder; the callable ``load_transformer`` returns.

The folder's ``config.json`` (``_class_name: FluxTransformer2DModel``) gives the
architecture; its safetensors (one file or a sharded index) are read through the table of
:mod:`.convert` with the strict key and shape checks of :mod:`ditax.io.convert` (one error
listing every missing / unexpected key, every tensor of the wrong shape) before any tensor is
read. The steps are the one loader's (:class:`~ditax.models.common.loader.TransformerLoader`,
:data:`LOADER`); what is Flux's own here: its architecture's data, BFL single files, the
``ditax convert`` folder check and :class:`FluxTransformerModel`'s call.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights, is_single_file
from ditax.models.common import loaded
from ditax.models.common.loader import Architecture, TransformerLoader, plain_weights
from ditax.models.flux.build import abstract_model
from ditax.models.flux.config import (CLASS_NAME, FluxConfig, check_transformer,
                                      same_architecture)
from ditax.models.flux.convert import param_axes, weight_table
from ditax.models.flux.lora_names import LORA_NAMES
from ditax.models.common.loaded import LoadedTransformer


def read_config(folder) -> dict:
    """``folder/config.json``, which must describe a ``FluxTransformer2DModel``."""
    return LOADER.read_config(folder)


def _open_weights(source, cfg, table, shapes):
    """A diffusers source as stored; one file with BFL's names (:mod:`.single_file`) as a
    view under the diffusers keys of ``table``."""
    if not is_single_file(source):
        return plain_weights(source, cfg, table, shapes)
    from ditax.models.flux.single_file import open_single_file

    return open_single_file(source, cfg, table, shapes), table, None


def _single_file_config(path, config, **overrides) -> FluxConfig:
    from ditax.models.flux.single_file import single_file_config

    return single_file_config(path, config, **overrides)


def load_weights_into(model_abs, source, cfg: FluxConfig, mesh=None, loras=None,
                      lora_strict: bool = True):
    """Fill an abstract model's parameters from a diffusers safetensors folder, or one file
    (BFL's names too: :mod:`.single_file`); with a mesh, each parameter is read slice by
    slice straight into its NamedSharding. ``loras`` (see :func:`ditax.lora.resolve_loras`)
    are merged into each slice as it is read, then (``cfg.quantize``) the block linears
    quantized to 8 bits (:mod:`ditax.nn.quant`;
    :meth:`ditax.models.common.loader.TransformerLoader.load_weights_into`)."""
    return LOADER.load_weights_into(model_abs, source, cfg, mesh, loras, lora_strict)


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

    A pytree of its parameters (:class:`~ditax.models.common.loaded.LoadedTransformer`), so it
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
                     lora_strict: bool = True, lora_mode: str = "merged",
                     **model_overrides) -> FluxTransformerModel:
    """Load a Flux transformer from a diffusers folder (a ``transformer/`` folder, a pipeline
    folder that has one, or a hub id when online), or one ``.safetensors`` file (BFL's
    ``flux1-dev.safetensors`` names, or diffusers') with ``config=``. Every argument is the one
    loader's (:meth:`ditax.models.common.loader.TransformerLoader.load`); Flux's own:

    - ``config``: a :class:`FluxConfig` (``ditax.load_transformer``: also a preset such as
      ``"flux.1-dev"``); ``model_overrides``: other :class:`FluxConfig` fields;
    - ``loras``: diffusers / PEFT, kohya, BFL / ComfyUI or XLabs keys (:mod:`.lora_names`).
    """
    return LOADER.load(path, dtype, mesh, attention, subfolder, config=config, loras=loras,
                       lora_strict=lora_strict, lora_mode=lora_mode, **model_overrides)


LOADER = TransformerLoader(
    family="Flux",
    architectures=(Architecture(CLASS_NAME, FluxConfig, abstract_model, weight_table,
                                param_axes, FluxTransformerModel),),
    check_transformer=check_transformer,
    single_file_config=_single_file_config,
    lora_names=LORA_NAMES,
    describe=lambda c: f"{c.num_layers} + {c.num_single_layers} layers, D={c.inner_dim}",
    open_weights=_open_weights,
)


__all__ = ["FluxTransformerModel", "load_transformer", "load_weights_into", "read_config",
           "check_architecture", "check_folder"]
