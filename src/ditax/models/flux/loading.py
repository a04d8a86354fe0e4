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

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.common.bfl.loading import JointTransformerModel, joint_loader
from ditax.models.flux import build, convert
from ditax.models.flux.config import FluxConfig, check_transformer
from ditax.models.flux.lora_names import LORA_NAMES
from ditax.models.flux.single_file import SINGLE_FILE


def read_config(folder) -> dict:
    """``folder/config.json``, which must describe a ``FluxTransformer2DModel``."""
    return LOADER.read_config(folder)


def _forward(gdef, state, x, text, pooled, t, img_ids, txt_ids, guidance, text_mask):
    return nnx.merge(gdef, state)(x, t, text, pooled_projections=pooled, img_ids=img_ids,
                                  txt_ids=txt_ids, guidance=guidance, text_mask=text_mask)


_forward_jit = jax.jit(_forward, static_argnums=0)


@jax.tree_util.register_pytree_node_class
class FluxTransformerModel(JointTransformerModel):
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
        x, text, t, img_ids, txt_ids, g, mask = self.arrays(
            hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, guidance,
            text_mask)
        pooled = jnp.asarray(pooled_projections)
        self.module.check_inputs(x, t, text, pooled_projections=pooled, img_ids=img_ids,
                                 txt_ids=txt_ids, guidance=g, text_mask=mask)
        t, g = self.placed(x, t, g)
        return _forward_jit(self._gdef, self._state, self._place(x), self._place(text),
                            self._place(pooled), t, img_ids, txt_ids, g, self._place(mask))


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str | None = "transformer", **kwargs) -> FluxTransformerModel:
    """Load a Flux transformer from a diffusers folder (a ``transformer/`` folder, a pipeline
    folder that has one, or a hub id when online), or one ``.safetensors`` file (BFL's
    ``flux1-dev.safetensors`` names, or diffusers') with ``config=``. Every argument is the one
    loader's (:meth:`ditax.models.common.loader.TransformerLoader.load`: ``config=``,
    ``loras=``, ``lora_strict=``, ``lora_mode=`` and model overrides); Flux's own:

    - ``config``: a :class:`FluxConfig` (``ditax.load_transformer``: also a preset such as
      ``"flux.1-dev"``); ``model_overrides``: other :class:`FluxConfig` fields;
    - ``loras``: diffusers / PEFT, kohya, BFL / ComfyUI or XLabs keys (:mod:`.lora_names`).
    """
    return LOADER.load(path, dtype, mesh, attention, subfolder, **kwargs)


LOADER = joint_loader("Flux", FluxConfig, build, convert, FluxTransformerModel,
                      check_transformer, LORA_NAMES, SINGLE_FILE.config,
                      SINGLE_FILE.open_weights)


__all__ = ["FluxTransformerModel", "load_transformer", "read_config", "LOADER"]
