"""Load the LTX-2 transformer from a diffusers folder; the callable ``load_transformer`` returns.

The folder's ``config.json`` (``_class_name: LTX2VideoTransformer3DModel``) gives the
architecture (a key this version does not know is refused,
:func:`~ditax.models.ltx2.config.check_known_keys`); its safetensors (one file or a sharded
index) are read through the table of :mod:`.convert` with the strict key and shape checks of
:mod:`ditax.io.convert` before any tensor is read. The steps are the one loader's
(:class:`~ditax.models.common.loader.TransformerLoader`, :data:`LOADER`); what is LTX-2's own
here is :class:`LTX2TransformerModel`'s call, original single files (:mod:`.single_file`) and
the ``ditax convert`` folder check.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.common.loaded import LoadedTransformer
from ditax.models.common.loader import Architecture, TransformerLoader
from ditax.models.ltx2.config import CLASS_NAME, LTX2Config, check_transformer
from ditax.models.ltx2.lora_names import LORA_NAMES
from ditax.models.ltx2.transformer.build import abstract_model
from ditax.models.ltx2.transformer.convert import param_axes, weight_table
from ditax.models.ltx2.transformer.inputs import CallInputs, stg_flags
from ditax.models.ltx2.transformer.single_file import open_weights, single_file_config


def read_config(folder) -> dict:
    """``folder/config.json``, which must describe an ``LTX2VideoTransformer3DModel``."""
    return LOADER.read_config(folder)


def _forward(gdef, state, arrays: dict, isolate: bool, cross: bool):
    return nnx.merge(gdef, state)(**arrays, isolate_modalities=isolate,
                                  use_cross_timestep=cross)


_forward_jit = jax.jit(_forward, static_argnums=(0, 3, 4))


@jax.tree_util.register_pytree_node_class
class LTX2TransformerModel(LoadedTransformer):
    """What ``ditax.load_transformer`` returns for an LTX-2 folder: a jitted, mesh-aware
    callable with diffusers' keyword names,

    ``tr(hidden_states [B, L, C], audio_hidden_states [B, La, Ca], encoder_hidden_states
    [B, T, Dt], audio_encoder_hidden_states [B, Ta, Dta], timestep [B] | [B, L],
    audio_timestep=None, sigma=None, audio_sigma=None, encoder_attention_mask=None,
    audio_encoder_attention_mask=None, num_frames=None, height=None, width=None, fps=24.0,
    audio_num_frames=None, video_coords=None, audio_coords=None, isolate_modalities=False,
    spatio_temporal_guidance_blocks=None, perturbation_mask=None, use_cross_timestep=False,
    video_keyframes_mask=None) → (video [B, L, C_out], audio [B, La, Ca_out])`` — diffusers'
    ``return_dict=False`` tuple
    (:mod:`ditax.models.ltx2.transformer.model` has the meanings). The RoPE positions are computed
    on the host from the sizes or the coordinates before the compiled forward, and the
    STG blocks become one flag per block (traced): another set of blocks does not recompile.

    A pytree of its parameters (:class:`~ditax.models.common.loaded.LoadedTransformer`), so it
    composes with a user's ``jax.jit`` / ``jax.grad``.
    """

    def __call__(self, hidden_states, audio_hidden_states, encoder_hidden_states,
                 audio_encoder_hidden_states, timestep, **inputs):
        """``inputs``: the call's other keywords, diffusers' names
        (:class:`~ditax.models.ltx2.transformer.inputs.CallInputs`)."""
        module, i = self.module, CallInputs(**inputs)
        as_array = lambda v, dt=None: None if v is None else jnp.asarray(v, dt)  # noqa: E731
        x, a = as_array(hidden_states), as_array(audio_hidden_states)
        text, audio_text = as_array(encoder_hidden_states), as_array(audio_encoder_hidden_states)
        times = {k: as_array(v, jnp.float32) for k, v in (
            ("timestep", timestep), ("audio_timestep", i.audio_timestep), ("sigma", i.sigma),
            ("audio_sigma", i.audio_sigma))}
        masks = dict(encoder_attention_mask=as_array(i.encoder_attention_mask),
                     audio_encoder_attention_mask=as_array(i.audio_encoder_attention_mask),
                     video_keyframes_mask=as_array(i.video_keyframes_mask))
        others = {k: v for k, v in times.items() if k != "timestep"}
        module.check_inputs(x, a, text, audio_text, times["timestep"],
                            **dict(inputs, **others, **masks))
        b = x.shape[0]
        for k, v in times.items():      # a scalar (or [1]) is every sample's
            if v is not None and (v.ndim == 0 or (v.ndim == 1 and v.shape[0] == 1)):
                times[k] = jnp.broadcast_to(v.reshape(-1), (b,))
        flags = stg_flags(i.spatio_temporal_guidance_blocks, module.cfg.num_layers)
        stg = {} if flags is None else dict(perturbation_mask=as_array(i.perturbation_mask,
                                                                         jnp.float32))
        positions = module.positions(i.num_frames, i.height, i.width, i.fps,
                                     i.audio_num_frames, i.video_coords, i.audio_coords)
        positions = jax.tree.map(lambda p: self._place(p) if p.shape[0] == b > 1 else p,
                                 positions)
        arrays = dict(hidden_states=x, audio_hidden_states=a, encoder_hidden_states=text,
                      audio_encoder_hidden_states=audio_text, **times, **masks, **stg)
        arrays = {k: self._place(v) for k, v in arrays.items()}
        if flags is not None:       # one flag per block, on every device
            arrays["spatio_temporal_guidance_blocks"] = jnp.asarray(flags)
        return _forward_jit(self._gdef, self._state, dict(arrays, positions=positions),
                            bool(i.isolate_modalities), bool(i.use_cross_timestep))


def folder_summary(cfg) -> str:
    """The model's blocks and widths (a checked folder's summary)."""
    return (f"{cfg.num_layers} blocks, video D={cfg.inner_dim} ({cfg.num_attention_heads} "
            f"heads x {cfg.attention_head_dim}), audio Da={cfg.audio_inner_dim}")


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str | None = "transformer", **kwargs) -> LTX2TransformerModel:
    """Load an LTX-2 transformer from a diffusers folder (a ``transformer/`` folder, a
    pipeline folder that has one, or a hub id when online), or from one ``.safetensors`` file
    (an original Lightricks checkpoint: its transformer only, :mod:`.single_file`) with
    ``config=`` an :class:`LTX2Config`. Every argument is the one
    loader's (:meth:`ditax.models.common.loader.TransformerLoader.load`: ``config=``, ``loras=``
    in the family's key formats, and :class:`LTX2Config` numerics such as ``remat="full"`` or
    ``scan_layers=False``)."""
    return LOADER.load(path, dtype, mesh, attention, subfolder, **kwargs)


LOADER = TransformerLoader(
    family="LTX-2",
    architectures=(Architecture(CLASS_NAME, LTX2Config, abstract_model, weight_table,
                                param_axes, LTX2TransformerModel),),
    check_transformer=check_transformer,
    single_file_config=single_file_config,
    lora_names=LORA_NAMES,
    describe=lambda c: f"{c.num_layers} layers, D={c.inner_dim}, Da={c.audio_inner_dim}",
    open_weights=open_weights,
)


__all__ = ["LTX2TransformerModel", "folder_summary", "load_transformer", "read_config",
           "LOADER"]
