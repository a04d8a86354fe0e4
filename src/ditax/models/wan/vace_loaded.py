"""What ``ditax.load_transformer`` returns for a ``WanVACETransformer3DModel`` folder: the
jitted, mesh-aware callable around :class:`~ditax.models.wan.vace.WanVaceTransformer`
(loaded by :func:`ditax.models.wan.loading.load_transformer`, which dispatches on the folder's
``_class_name``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ditax.models.common.loaded import LoadedTransformer
from ditax.models.wan.extra_inputs import checked_inputs, forward


@jax.tree_util.register_pytree_node_class
class VaceTransformer(LoadedTransformer):
    """``tr(latents [B, C, F, Y, X], timestep [B], text [B, T, Dt], control_hidden_states=
    [B, C_v, F, Y, X], control_hidden_states_scale=[n] | None) → [B, C, F, Y, X]``, diffusers'
    ``WanVACETransformer3DModel`` call (a pytree like the plain Wan callable)."""

    def __call__(self, latents, timestep, encoder_hidden_states, text_mask=None,
                 encoder_hidden_states_image=None, control_hidden_states=None,
                 control_hidden_states_scale=None):
        if encoder_hidden_states_image is not None:
            raise ValueError("encoder_hidden_states_image: this VACE transformer has no image "
                             "embedder (image_dim=None); drop it")
        wan, (control, scale) = checked_inputs(
            self.module, self.module.check_control,
            (control_hidden_states, control_hidden_states_scale), latents, timestep,
            encoder_hidden_states, text_mask)
        if scale is not None:
            scale = scale.astype(jnp.float32)
            if scale.ndim == 1:
                scale = jnp.broadcast_to(scale, (wan[0].shape[0], scale.shape[0]))
        return forward(self._gdef, self._state, *map(self._place, wan + (control, scale)))


__all__ = ["VaceTransformer"]
