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
from ditax.errors import ConfigError, check_choice
from ditax.io.convert import load_params, param_shapes
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights, is_single_file
from ditax.models.flux.build import abstract_model
from ditax.models.flux.config import (CLASS_NAME, FluxConfig, check_transformer,
                                      same_architecture)
from ditax.models.flux.convert import param_axes, weight_table
from ditax.models.flux.lora_names import LORA_NAMES
from ditax.models import loaded
from ditax.models.loaded import LoadedTransformer, param_sharding
from ditax.nn import quant
from ditax.parallel.mesh import MESH_AXES, check_mesh_axes

log = logging.getLogger(__name__)


def read_config(folder) -> dict:
    """``folder/config.json``, which must describe a ``FluxTransformer2DModel``."""
    cfg = read_model_json(pathlib.Path(folder) / "config.json", "transformer config")
    cls = cfg.get("_class_name")
    if cls != CLASS_NAME:
        raise ConfigError(f"{folder}/config.json is a {cls}, not a {CLASS_NAME}")
    return cfg


def load_weights_into(model_abs, source, cfg: FluxConfig, mesh=None, loras=None,
                      lora_strict: bool = True):
    """Fill an abstract model's parameters from a diffusers safetensors folder, or one file
    (BFL's names too: :mod:`.single_file`); with a mesh, each parameter is read slice by
    slice straight into its NamedSharding. ``loras`` (see :func:`ditax.lora.resolve_loras`)
    are merged into each slice as it is read, then (``cfg.quantize``) the block linears
    quantized to 8 bits (:mod:`ditax.nn.quant`)."""
    gdef, state = nnx.split(model_abs)
    table = weight_table(cfg)
    if is_single_file(source):
        from ditax.models.flux.single_file import open_single_file

        weights = open_single_file(source, cfg, table, param_shapes(state))
    else:
        weights = Weights.open(source)
    quantizers = quant.prepare(model_abs, cfg, weights, source, mesh)   # {} unquantized
    gdef, state = nnx.split(model_abs)
    if loras:
        from ditax.lora import merged_weights

        weights = merged_weights(weights, loras, table, param_shapes(state), names=LORA_NAMES,
                                 strict=lora_strict)
    state = load_params(table, weights, state, jnp.dtype(cfg.param_dtype),
                        param_sharding(quant.with_scale_axes(param_axes(cfg)), mesh),
                        quantizers)
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

    def set_lora_strengths(self, strengths) -> None:
        """New strengths for LoRAs loaded with ``lora_mode="unmerged"`` (one per LoRA, in
        order). Only values change, so nothing recompiles."""
        from ditax.lora.unmerged import set_strengths

        set_strengths(self.module, strengths, self.mesh)
        self._gdef, self._state = nnx.split(self.module)


LORA_MODES = ("merged", "unmerged")


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str | None = "transformer", *, config=None, loras=None,
                     lora_strict: bool = True, lora_mode: str = "merged",
                     **model_overrides) -> FluxTransformerModel:
    """Load a Flux transformer from a diffusers folder (a ``transformer/`` folder with
    config.json + safetensors [+ index], a pipeline folder that has ``transformer/``, or a hub
    id when online), or one ``.safetensors`` file (BFL's ``flux1-dev.safetensors`` names, or
    diffusers') with ``config=``.

    Args:
      config: the architecture of a single-file checkpoint, a :class:`FluxConfig` (the public
        ``ditax.load_transformer`` also takes a preset name such as ``"flux.1-dev"`` or a YAML
        path); folders have their own ``config.json``.
      dtype: parameter and compute dtype ("float32" | "bfloat16" | "float16").
      mesh: optional ``jax.sharding.Mesh`` with axes (data, fsdp, context, tensor).
      attention: a backend name or an :class:`~ditax.attention.config.AttentionConfig`.
      loras: ``[(file, strength), ...]`` (a bare file = 1.0; a parsed
        :class:`ditax.lora.Lora`): diffusers / PEFT, kohya, BFL / ComfyUI or XLabs keys
        (:mod:`.lora_names`); ``lora_strict=False`` skips keys that match no layer (warning).
      lora_mode: "merged" (folded into the weights while they load) or "unmerged" (low-rank
        updates at run time; :meth:`FluxTransformerModel.set_lora_strengths`; Linear layers
        only).
      quantize / quantize_activations (model config fields, passed as keywords): "int8" |
        "fp8" stores the block attention / FFN linears in 8 bits with per-output-channel
        scales, quantized slice by slice as each device reads its slice (merged LoRAs first);
        ``quantize_activations=True`` makes their dots 8-bit x 8-bit (:mod:`ditax.nn.quant`;
        the load log says whether they are native on this platform).
      model_overrides: other :class:`FluxConfig` fields (e.g. ``remat="full"``).

    The model, attention and mesh are checked here, once, before anything is built.
    """
    t0 = time.perf_counter()
    check_choice("lora_mode", lora_mode, LORA_MODES)
    if is_single_file(path):
        from ditax.models.flux.single_file import single_file_config

        source = pathlib.Path(path)
        cfg = single_file_config(path, config, param_dtype=dtype, dtype=dtype,
                                 **model_overrides)
    elif config is not None:
        raise ConfigError(f"config= is for single-file checkpoints; {path} is read with its own "
                          f"config.json (pass model overrides as keywords instead)")
    else:
        source = resolve_folder(path, subfolder)
        cfg = FluxConfig.from_diffusers(read_config(source), param_dtype=dtype, dtype=dtype,
                                        **model_overrides)
    acfg = as_attention_config(attention)
    quant.check_lora_mode(cfg, loras, lora_mode)
    check_mesh_axes(mesh)
    check_transformer(cfg, acfg, None if mesh is None else
                      {a: int(mesh.shape[a]) for a in MESH_AXES})
    model = load_weights_into(abstract_model(cfg, acfg, mesh), source, cfg, mesh,
                              loras if lora_mode == "merged" else None, lora_strict)
    if loras and lora_mode == "unmerged":
        from ditax.lora import resolve_loras
        from ditax.lora.unmerged import attach

        attach(model, resolve_loras(loras, lora_strict, names=LORA_NAMES), weight_table(cfg),
               mesh, names=LORA_NAMES)
    log.info("loaded %s (%d + %d layers, D=%d) in %.1fs", source, cfg.num_layers,
             cfg.num_single_layers, cfg.inner_dim, time.perf_counter() - t0)
    return FluxTransformerModel(model)


__all__ = ["FluxTransformerModel", "load_transformer", "load_weights_into", "read_config",
           "check_architecture", "check_folder"]
