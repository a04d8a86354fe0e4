"""Load the Wan transformer (built by :mod:`.build`); the callable ``load_transformer`` returns.

With a mesh, every parameter is created straight into its sharding: each device's slice is read
from the safetensors file on its own (``ditax.io.convert.load_params`` with
``jax.make_array_from_callback``) — no full copy of the model on any device.
"""

from __future__ import annotations

import pathlib
import logging
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
from ditax.models.wan import convert, single_file
from ditax.models.wan.build import abstract_model
from ditax.models.wan.config import WanConfig, check_transformer
from ditax.models.wan.lora_names import LORA_NAMES
from ditax.models.wan.transformer import WanTransformer
from ditax.models.wan import vace_convert
from ditax.models.wan.vace import VACE_CLASS, WanVaceConfig, check_vace
from ditax.models.wan.vace_loaded import VaceTransformer
from ditax.models.wan import animate_convert
from ditax.models.wan.animate import ANIMATE_CLASS, WanAnimateConfig, check_animate
from ditax.models.wan.animate_loaded import AnimateTransformer
from ditax.models.loaded import LoadedTransformer, param_sharding
from ditax.models.loaded import check_architecture as check_arch
from ditax.nn import quant
from ditax.parallel.mesh import MESH_AXES, check_mesh_axes

log = logging.getLogger(__name__)

LORA_MODES = ("merged", "unmerged")


def read_config(folder) -> dict:
    cfg = read_model_json(folder / "config.json", "transformer config")
    cls = cfg.get("_class_name", "WanTransformer3DModel")
    if cls not in ("WanTransformer3DModel", VACE_CLASS, ANIMATE_CLASS):
        raise ConfigError(f"{folder}/config.json is a {cls}, not a WanTransformer3DModel "
                          f"(or {VACE_CLASS}, {ANIMATE_CLASS})")
    return cfg


def _tables(cfg):
    """(weight table, parameter axes) of ``cfg``'s architecture: Wan's, or VACE's."""
    if isinstance(cfg, WanVaceConfig):
        return vace_convert.config_weight_table(cfg), vace_convert.config_param_axes(cfg)
    if isinstance(cfg, WanAnimateConfig):
        return animate_convert.config_weight_table(cfg), animate_convert.config_param_axes(cfg)
    return convert.config_weight_table(cfg), convert.config_param_axes(cfg)


def load_weights_into(model_abs, source, cfg: WanConfig, mesh=None, loras=None,
                      lora_strict: bool = True) -> WanTransformer:
    """Fill an abstract model's parameters from a diffusers safetensors folder, or from a
    checkpoint with the original Wan / ComfyUI key names (:mod:`.single_file`).

    With a mesh, each parameter is read slice by slice straight into its NamedSharding.
    ``loras`` (see :func:`ditax.lora.resolve_loras`) are merged into each slice as it is read,
    then (``cfg.quantize``) the block linears quantized to 8 bits (:mod:`ditax.nn.quant`).
    """
    weights = Weights.open(source)
    quantizers = quant.prepare(model_abs, cfg, weights, source, mesh)   # {} unquantized
    gdef, state = nnx.split(model_abs)
    table, axes = _tables(cfg)
    sharding = param_sharding(quant.with_scale_axes(axes), mesh)
    read_table, rename = table, None
    if single_file.is_original(weights.keys()):
        prefix = single_file.key_prefix(weights.keys())
        read_table, rename = single_file.original_table(table, prefix), single_file.renamer(prefix)
    if loras:
        from ditax.lora import merged_weights

        weights = merged_weights(weights, loras, table, param_shapes(state), names=LORA_NAMES,
                                 strict=lora_strict, rename=rename)
    state = load_params(read_table, weights, state, jnp.dtype(cfg.param_dtype), sharding,
                        quantizers)
    return nnx.merge(gdef, state)


ARCH_FIELDS = ("patch_size", "num_attention_heads", "attention_head_dim", "in_channels",
               "out_channels", "text_dim", "freq_dim", "ffn_dim", "num_layers",
               "cross_attn_norm", "eps", "rope_max_seq_len", "image_dim", "added_kv_proj_dim",
               "pos_embed_seq_len")


def check_architecture(cfg: WanConfig, path) -> "pathlib.Path":
    """The transformer folder at ``path`` if its config.json has ``cfg``'s architecture.

    Raises :class:`ConfigError` listing every differing field with the ``model.X=...``
    overrides that would match the folder (used by ``init_from`` before anything compiles).
    """
    folder = resolve_folder(path, "transformer")
    theirs = WanConfig.from_diffusers(read_config(folder))
    fields = ARCH_FIELDS + ("vace_layers",) + (("vace_in_channels",) if cfg.vace_layers else ())
    check_arch(path, [(f, getattr(cfg, f), getattr(theirs, f)) for f in fields
                      if getattr(cfg, f) != getattr(theirs, f)])
    return folder


def _forward(gdef, state, latents, t, text, text_mask, image=None):
    return nnx.merge(gdef, state)(latents, t, text, text_mask, image)


_forward_jit = jax.jit(_forward, static_argnums=0)


@jax.tree_util.register_pytree_node_class
class Transformer(LoadedTransformer):
    """What ``ditax.load_transformer`` returns: a jitted, mesh-aware callable around the module.

    ``tr(latents [B, C, F, Y, X], timestep [B], text [B, T, text_dim]) → [B, C, F, Y, X]``.
    Image-to-video models also take ``encoder_hidden_states_image=`` (CLIP features).
    ``tr.module`` is the NNX module (for training or custom use), ``tr.config`` its config.

    A pytree (leaves: the parameters; static: the graph, which holds the mesh) whose call is a pure
    function of its parameters and inputs, so it composes with a user's own transforms:
    ``jax.jit(lambda tr, x, t, c: tr(x, t, c))(tr, x, t, c)`` takes the parameters as
    arguments (closing over ``tr`` instead bakes them into the program as constants), and
    ``jax.grad`` of a function of ``tr`` gives a ``Transformer`` of gradients (the pytree half
    is :class:`~ditax.models.loaded.LoadedTransformer`; ``config``: its :class:`WanConfig`).
    """

    def __call__(self, latents, timestep, encoder_hidden_states, text_mask=None,
                 encoder_hidden_states_image=None):
        latents = jnp.asarray(latents)
        text = jnp.asarray(encoder_hidden_states)
        image = encoder_hidden_states_image
        image = None if image is None else jnp.asarray(image)
        self.module.check_inputs(latents, jnp.asarray(timestep), text, text_mask, image)
        t = jnp.asarray(timestep, jnp.float32)
        t = jnp.broadcast_to(t, (latents.shape[0],) + t.shape[1:] if t.ndim == 2
                             else (latents.shape[0],))   # [B] or per token [B, L]
        args = [self._place(latents), self._place(t), self._place(text),
                None if text_mask is None else self._place(jnp.asarray(text_mask, bool)),
                self._place(image)]
        return _forward_jit(self._gdef, self._state, *args)

    def set_lora_strengths(self, strengths) -> None:
        """New strengths for LoRAs loaded with ``lora_mode="unmerged"`` (one per LoRA, in
        order). Only values change, so nothing recompiles."""
        from ditax.lora.unmerged import set_strengths

        set_strengths(self.module, strengths, self.mesh)
        self._gdef, self._state = nnx.split(self.module)


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str = "transformer", *, config=None, loras=None,
                     lora_strict: bool = True, lora_mode: str = "merged",
                     **model_overrides) -> Transformer:
    """Load a Wan transformer: a diffusers folder (or pipeline folder / hub id), or a single
    original Wan / ComfyUI ``.safetensors`` file with ``config=``.

    Args:
      path: ``transformer/`` folder (config.json + *.safetensors [+ index]; a
        ``WanVACETransformer3DModel`` one loads as :class:`VaceTransformer`), a pipeline folder
        that has ``transformer/`` (or ``subfolder``), a hub id when online, or one
        ``.safetensors`` file with original Wan / ComfyUI key names
        (``wan2.1_t2v_1.3B_bf16.safetensors``).
      config: the architecture of a single-file checkpoint, a :class:`WanConfig` (the public
        ``ditax.load_transformer`` also takes a preset name such as ``"wan2.1-t2v-1.3b"`` or a
        YAML path); folders have their own ``config.json``.
      dtype: parameter and compute dtype ("float32" | "bfloat16" | "float16").
      mesh: optional ``jax.sharding.Mesh`` with axes (data, fsdp, context, tensor).
      attention: a backend name or an :class:`AttentionConfig`.
      loras: LoRAs merged into the weights as they load: ``[(file, strength), ...]`` (a bare
        file = strength 1.0; a parsed :class:`ditax.lora.Lora` instead of a file); any format
        of :mod:`ditax.lora`.
      lora_strict: False = LoRA keys that match no layer are skipped with a warning instead of
        an error.
      lora_mode: "merged" (folded into the weights while they load: no run-time cost) or
        "unmerged" (low-rank updates at run time; ``Transformer.set_lora_strengths`` changes
        strengths without recompiling; Linear layers only).
      quantize / quantize_activations (model config fields, passed as keywords): "int8" |
        "fp8" stores the block attention / FFN linears in 8 bits with per-output-channel
        scales, quantized slice by slice as each device reads its slice (merged LoRAs first);
        ``quantize_activations=True`` makes their dots 8-bit x 8-bit (:mod:`ditax.nn.quant`;
        the load log says whether they are native on this platform).
      model_overrides: other :class:`WanConfig` fields (e.g. ``remat="full"``).

    The model, attention and mesh are checked here, once (:func:`check_transformer` with the
    mesh's sizes), before anything is built.
    """
    t0 = time.perf_counter()
    check_choice("lora_mode", lora_mode, LORA_MODES)
    if is_single_file(path):
        source = pathlib.Path(path)
        cfg = single_file.single_file_config(path, config, param_dtype=dtype, dtype=dtype,
                                             **model_overrides)
    elif config is not None:
        raise ConfigError(f"config= is for single-file checkpoints; {path} is read with its own "
                          f"config.json (pass model overrides as keywords instead)")
    else:
        source = resolve_folder(path, subfolder)
        raw = read_config(source)
        cls = {VACE_CLASS: WanVaceConfig, ANIMATE_CLASS: WanAnimateConfig}.get(
            raw.get("_class_name"), WanConfig)
        cfg = cls.from_diffusers(raw, param_dtype=dtype, dtype=dtype, **model_overrides)
    acfg = as_attention_config(attention)
    quant.check_lora_mode(cfg, loras, lora_mode)
    check_mesh_axes(mesh)
    check_transformer(cfg, acfg, None if mesh is None else
                      {a: int(mesh.shape[a]) for a in MESH_AXES})
    vace = isinstance(cfg, WanVaceConfig)
    if vace:
        check_vace(cfg)
    merged = loras if lora_mode == "merged" else None
    animate = isinstance(cfg, WanAnimateConfig)
    if animate:
        check_animate(cfg)
    build = (vace_convert.abstract_model if vace else
             animate_convert.abstract_model if animate else abstract_model)
    model = load_weights_into(build(cfg, acfg, mesh), source, cfg, mesh, merged, lora_strict)
    if loras and lora_mode == "unmerged":
        from ditax.lora import resolve_loras
        from ditax.lora.unmerged import attach

        attach(model, resolve_loras(loras, lora_strict, names=LORA_NAMES),
               _tables(cfg)[0], mesh, names=LORA_NAMES)
    log.info("loaded %s (%d layers, D=%d) in %.1fs", source, cfg.num_layers, cfg.inner_dim,
             time.perf_counter() - t0)
    return (VaceTransformer if vace else AnimateTransformer if animate else Transformer)(model)
