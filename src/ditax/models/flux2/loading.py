"""Load the FLUX.2 transformer from a diffusers folder; the callable ``load_transformer``
returns.

The folder's ``config.json`` (``_class_name: Flux2Transformer2DModel``) gives the
architecture; its safetensors (one file or a sharded index) are read through the table of
:mod:`.convert` with the strict key and shape checks of :mod:`ditax.io.convert` (one error
listing every missing / unexpected key, every tensor of the wrong shape) before any tensor is
read. The steps are the one loader's (:class:`~ditax.models.common.loader.TransformerLoader`,
:data:`LOADER`): LoRAs merged as the weights load, ``quantize="int8" | "fp8"`` storing the
block linears in 8 bits. What is FLUX.2's own here: its architecture's data, the ``ditax
convert`` folder check and :class:`Flux2TransformerModel`'s call.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.errors import ConfigError
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights
from ditax.models.common import loaded
from ditax.models.common.loaded import LoadedTransformer
from ditax.models.common.loader import Architecture, TransformerLoader
from ditax.models.flux2.build import abstract_model
from ditax.models.flux2.config import (CLASS_NAME, Flux2Config, check_transformer,
                                       same_architecture)
from ditax.models.flux2.convert import param_axes, weight_table
from ditax.models.flux2.lora_names import LORA_NAMES


def read_config(folder) -> dict:
    """``folder/config.json``, which must describe a ``Flux2Transformer2DModel``."""
    return LOADER.read_config(folder)


def _single_file_config(path, config, **overrides):
    raise ConfigError(f"{path}: this loader reads diffusers folders; load a FLUX.2 single file "
                      f"(BFL's flux2-*.safetensors) with ditax.load_transformer(path, "
                      f"config='flux.2-klein-4b') or ditax convert FILE --config PRESET")


def load_weights_into(model_abs, source, cfg: Flux2Config, mesh=None, loras=None,
                      lora_strict: bool = True):
    """Fill an abstract model's parameters from a diffusers safetensors folder; with a mesh,
    each parameter is read slice by slice straight into its NamedSharding. ``loras`` are
    merged into each slice as it is read, then (``cfg.quantize``) the block linears quantized
    to 8 bits (:meth:`ditax.models.common.loader.TransformerLoader.load_weights_into`)."""
    return LOADER.load_weights_into(model_abs, source, cfg, mesh, loras, lora_strict)


def check_architecture(cfg: Flux2Config, path) -> pathlib.Path:
    """The transformer folder at ``path`` if its config.json has ``cfg``'s architecture;
    else a :class:`ConfigError` listing every differing field and the ``model.X=...``
    overrides that would match (``init_from``, before anything compiles)."""
    folder = resolve_folder(path, "transformer")
    loaded.check_architecture(path, same_architecture(
        cfg, Flux2Config.from_diffusers(read_config(folder))))
    return folder


def check_folder(path, subfolder: str | None = "transformer") -> str:
    """Check a FLUX.2 transformer folder from config.json and the safetensors headers only
    (every key present, none unexpected, every shape right) for ``ditax convert``; returns a
    one-line summary, raises :class:`~ditax.errors.WeightError` naming what does not fit."""
    import math

    from ditax.io.convert import check_weights, param_shapes

    folder = resolve_folder(path, subfolder)
    cfg = Flux2Config.from_diffusers(read_config(folder))
    check_transformer(cfg)
    weights = Weights.open(folder)
    shapes = param_shapes(nnx.state(abstract_model(cfg)))
    check_weights(weight_table(cfg), weights, shapes)
    n = sum(math.prod(s) for s in shapes.values())
    return (f"{folder}: OK — {cfg.num_layers} double + {cfg.num_single_layers} single blocks, "
            f"D={cfg.inner_dim}, {cfg.num_attention_heads} heads x {cfg.attention_head_dim}, "
            f"{n / 1e9:.3f} B params, {len(weights)} tensors")


def _forward(gdef, state, x, text, t, img_ids, txt_ids, guidance, text_mask):
    return nnx.merge(gdef, state)(x, text, t, img_ids, txt_ids, guidance, text_mask)


_forward_jit = jax.jit(_forward, static_argnums=0)


@jax.tree_util.register_pytree_node_class
class Flux2TransformerModel(LoadedTransformer):
    """What ``ditax.load_transformer`` returns for a FLUX.2 folder: a jitted, mesh-aware
    callable in diffusers' argument order,

    ``tr(hidden_states [B, L, C_in], encoder_hidden_states [B, T, Dt], timestep [B] in
    [0, 1], img_ids [L, 4] | [B, L, 4], txt_ids [T, 4] | [B, T, 4], guidance [B] | None)
    → [B, L, C_out]``, plus ``text_mask=[B, T]`` (optional, True = token).

    A pytree of its parameters (:class:`~ditax.models.common.loaded.LoadedTransformer`), so it
    composes with a user's ``jax.jit`` / ``jax.grad``.
    """

    def __call__(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
                 guidance=None, text_mask=None):
        x, text = jnp.asarray(hidden_states), jnp.asarray(encoder_hidden_states)
        img_ids, txt_ids = jnp.asarray(img_ids), jnp.asarray(txt_ids)
        t = jnp.asarray(timestep, jnp.float32)
        g = None if guidance is None else jnp.asarray(guidance, jnp.float32)
        mask = None if text_mask is None else jnp.asarray(text_mask, bool)
        self.module.check_inputs(x, text, t, img_ids, txt_ids, g, mask)
        b = x.shape[0]
        t = jnp.broadcast_to(t, (b,))
        g = None if g is None else jnp.broadcast_to(g, (b,))
        img_ids = img_ids[0] if img_ids.ndim == 3 else img_ids
        txt_ids = txt_ids[0] if txt_ids.ndim == 3 else txt_ids
        args = [self._place(a) for a in (x, text, t)]
        return _forward_jit(self._gdef, self._state, *args, img_ids, txt_ids, self._place(g),
                            self._place(mask))


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str | None = "transformer", *, config=None, loras=None,
                     lora_strict: bool = True, lora_mode: str = "merged",
                     **model_overrides) -> Flux2TransformerModel:
    """Load a FLUX.2 transformer from a diffusers folder (a ``transformer/`` folder, a pipeline
    folder that has one, or a hub id when online). Every argument is the one loader's
    (:meth:`ditax.models.common.loader.TransformerLoader.load`): ``quantize="int8" | "fp8"``
    and the other :class:`Flux2Config` numerics as keywords; ``loras``: diffusers / PEFT or
    BFL / ComfyUI keys (:mod:`.lora_names`)."""
    return LOADER.load(path, dtype, mesh, attention, subfolder, config=config, loras=loras,
                       lora_strict=lora_strict, lora_mode=lora_mode, **model_overrides)


def load_flux2_transformer(folder, dtype: str = "float32", mesh=None, attention="xla",
                           **kwargs) -> Flux2TransformerModel:
    """:func:`load_transformer` under the name the FLUX.2 pipelines use."""
    return load_transformer(folder, dtype, mesh, attention, **kwargs)


LOADER = TransformerLoader(
    family="FLUX.2",
    architectures=(Architecture(CLASS_NAME, Flux2Config, abstract_model, weight_table,
                                param_axes, Flux2TransformerModel),),
    check_transformer=check_transformer,
    single_file_config=_single_file_config,
    lora_names=LORA_NAMES,
    describe=lambda c: f"{c.num_layers} + {c.num_single_layers} layers, D={c.inner_dim}",
)


__all__ = ["Flux2TransformerModel", "load_transformer", "load_flux2_transformer",
           "load_weights_into", "read_config", "check_architecture", "check_folder"]
