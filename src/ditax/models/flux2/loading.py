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

import jax
from flax import nnx

from ditax.errors import ConfigError
from ditax.models.common.bfl.loading import JointTransformerModel, joint_loader
from ditax.models.flux2 import build, convert
from ditax.models.flux2.config import Flux2Config, check_transformer
from ditax.models.flux2.lora_names import LORA_NAMES


def read_config(folder) -> dict:
    """``folder/config.json``, which must describe a ``Flux2Transformer2DModel``."""
    return LOADER.read_config(folder)


def _single_file_config(path, config, **overrides):
    raise ConfigError(f"{path}: this loader reads diffusers folders; load a FLUX.2 single file "
                      f"(BFL's flux2-*.safetensors) with ditax.load_transformer(path, "
                      f"config='flux.2-klein-4b') or ditax convert FILE --config PRESET")


def _forward(gdef, state, x, text, t, img_ids, txt_ids, guidance, text_mask):
    return nnx.merge(gdef, state)(x, text, t, img_ids, txt_ids, guidance, text_mask)


_forward_jit = jax.jit(_forward, static_argnums=0)


@jax.tree_util.register_pytree_node_class
class Flux2TransformerModel(JointTransformerModel):
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
        x, text, t, img_ids, txt_ids, g, mask = self.arrays(
            hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, guidance,
            text_mask)
        self.module.check_inputs(x, text, t, img_ids, txt_ids, g, mask)
        t, g = self.placed(x, t, g)
        img_ids = img_ids[0] if img_ids.ndim == 3 else img_ids
        txt_ids = txt_ids[0] if txt_ids.ndim == 3 else txt_ids
        return _forward_jit(self._gdef, self._state, self._place(x), self._place(text), t,
                            img_ids, txt_ids, g, self._place(mask))


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str | None = "transformer", **kwargs) -> Flux2TransformerModel:
    """Load a FLUX.2 transformer from a diffusers folder (a ``transformer/`` folder, a pipeline
    folder that has one, or a hub id when online). Every argument is the one loader's
    (:meth:`ditax.models.common.loader.TransformerLoader.load`): ``quantize="int8" | "fp8"``
    and the other :class:`Flux2Config` numerics as keywords; ``loras``: diffusers / PEFT or
    BFL / ComfyUI keys (:mod:`.lora_names`)."""
    return LOADER.load(path, dtype, mesh, attention, subfolder, **kwargs)


def load_flux2_transformer(folder, dtype: str = "float32", mesh=None, attention="xla",
                           **kwargs) -> Flux2TransformerModel:
    """:func:`load_transformer` under the name the FLUX.2 pipelines use."""
    return load_transformer(folder, dtype, mesh, attention, **kwargs)


LOADER = joint_loader("FLUX.2", Flux2Config, build, convert, Flux2TransformerModel,
                      check_transformer, LORA_NAMES, _single_file_config)


__all__ = ["Flux2TransformerModel", "load_transformer", "load_flux2_transformer",
           "read_config", "LOADER"]
