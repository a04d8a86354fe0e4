"""Load the Wan transformer (built by :mod:`.build`); the callable ``load_transformer`` returns.

What is Wan's own: its three architectures (Wan, VACE, Animate: config class, tables, builder,
callable), the original / ComfyUI single-file names, and :class:`Transformer`'s call. The
steps (config, checks, abstract build, sharded reads, 8 bits, LoRA) are the one loader's,
:class:`~ditax.models.common.loader.TransformerLoader` (:data:`LOADER`): with a mesh, every
parameter is created straight into its sharding, each device reading its own slice — no full
copy of the model on any device.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights
from ditax.models.common.loader import Architecture, TransformerLoader
from ditax.models.common.loaded import LoadedTransformer
from ditax.models.common.loaded import check_architecture as check_arch
from ditax.models.wan import animate_convert, convert, single_file, vace_convert
from ditax.models.wan.animate import ANIMATE_CLASS, WanAnimateConfig, check_animate
from ditax.models.wan.animate_loaded import AnimateTransformer
from ditax.models.wan.build import abstract_model
from ditax.models.wan.config import CLASS_NAME, WanConfig, check_transformer
from ditax.models.wan.lora_names import LORA_NAMES
from ditax.models.wan.transformer import WanTransformer
from ditax.models.wan.vace import VACE_CLASS, WanVaceConfig, check_vace
from ditax.models.wan.vace_loaded import VaceTransformer

def read_config(folder) -> dict:
    """``folder/config.json``, which must describe a Wan, VACE or Animate transformer."""
    return LOADER.read_config(folder)


def _open_weights(source, cfg, table, shapes):
    """A diffusers source as stored; a single file with the original Wan / ComfyUI names
    (:mod:`.single_file`) through the table renamed to them, LoRA keys renamed alike."""
    weights = Weights.open(source)
    if not single_file.is_original(weights.keys()):
        return weights, table, None
    prefix = single_file.key_prefix(weights.keys())
    return weights, single_file.original_table(table, prefix), single_file.renamer(prefix)


def load_weights_into(model_abs, source, cfg: WanConfig, mesh=None, loras=None,
                      lora_strict: bool = True) -> WanTransformer:
    """Fill an abstract model's parameters from a diffusers safetensors folder, or from a
    checkpoint with the original Wan / ComfyUI key names (:mod:`.single_file`).

    With a mesh, each parameter is read slice by slice straight into its NamedSharding.
    ``loras`` (see :func:`ditax.lora.resolve_loras`) are merged into each slice as it is read,
    then (``cfg.quantize``) the block linears quantized to 8 bits (:mod:`ditax.nn.quant`;
    :meth:`ditax.models.common.loader.TransformerLoader.load_weights_into`).
    """
    return LOADER.load_weights_into(model_abs, source, cfg, mesh, loras, lora_strict)


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
    is :class:`~ditax.models.common.loaded.LoadedTransformer`; ``config``: its :class:`WanConfig`).
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


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str = "transformer", *, config=None, loras=None,
                     lora_strict: bool = True, lora_mode: str = "merged",
                     **model_overrides) -> Transformer:
    """Load a Wan transformer: a diffusers folder (or pipeline folder / hub id), or a single
    original Wan / ComfyUI ``.safetensors`` file with ``config=``. Every argument is the one
    loader's (:meth:`ditax.models.common.loader.TransformerLoader.load`); Wan's own:

    - ``path``: a ``WanVACETransformer3DModel`` folder loads as :class:`VaceTransformer`, a
      ``WanAnimateTransformer3DModel`` one as :class:`AnimateTransformer`; a single file may
      have the original Wan / ComfyUI key names (``wan2.1_t2v_1.3B_bf16.safetensors``);
    - ``config``: a :class:`WanConfig` (``ditax.load_transformer``: also a preset such as
      ``"wan2.1-t2v-1.3b"``); ``model_overrides``: other :class:`WanConfig` fields;
    - ``loras``: any format of :mod:`ditax.lora` (Wan's names: :mod:`.lora_names`).
    """
    return LOADER.load(path, dtype, mesh, attention, subfolder, config=config, loras=loras,
                       lora_strict=lora_strict, lora_mode=lora_mode, **model_overrides)


LOADER = TransformerLoader(
    family="Wan",
    architectures=(
        Architecture(CLASS_NAME, WanConfig, abstract_model, convert.config_weight_table,
                     convert.config_param_axes, Transformer),
        Architecture(VACE_CLASS, WanVaceConfig, vace_convert.abstract_model,
                     vace_convert.config_weight_table, vace_convert.config_param_axes,
                     VaceTransformer, check=check_vace),
        Architecture(ANIMATE_CLASS, WanAnimateConfig, animate_convert.abstract_model,
                     animate_convert.config_weight_table, animate_convert.config_param_axes,
                     AnimateTransformer, check=check_animate)),
    check_transformer=check_transformer,
    single_file_config=single_file.single_file_config,
    lora_names=LORA_NAMES,
    describe=lambda c: f"{c.num_layers} layers, D={c.inner_dim}",
    default_class=CLASS_NAME,
    open_weights=_open_weights,
)
