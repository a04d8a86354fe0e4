"""What ``ditax.load_transformer`` returns for a ``WanAnimateTransformer3DModel`` folder: the
jitted, mesh-aware callable around :class:`~ditax.models.wan.animate.WanAnimateTransformer`
(loaded by :func:`ditax.models.wan.loading.load_transformer`, which dispatches on the folder's
``_class_name``)."""

from __future__ import annotations

import jax

from ditax.models.common.loaded import LoadedTransformer
from ditax.models.wan.extra_inputs import checked_inputs, forward


@jax.tree_util.register_pytree_node_class
class AnimateTransformer(LoadedTransformer):
    """``tr(latents [B, 2z+4, F, Y, X], timestep [B], text [B, T, Dt],
    encoder_hidden_states_image [B, 257, Di], pose_hidden_states=[B, z, F-1, Y, X],
    face_pixel_values=[B, 3, S, P, P]) → [B, z, F, Y, X]``: diffusers'
    ``WanAnimateTransformer3DModel`` call (a pytree like the plain Wan callable)."""

    def __call__(self, latents, timestep, encoder_hidden_states, text_mask=None,
                 encoder_hidden_states_image=None, pose_hidden_states=None,
                 face_pixel_values=None):
        wan, (pose, face) = checked_inputs(
            self.module, self.module.check_animate_inputs, (pose_hidden_states, face_pixel_values),
            latents, timestep, encoder_hidden_states, text_mask, encoder_hidden_states_image)
        return forward(self._gdef, self._state, *map(self._place, wan + (pose, face)))


__all__ = ["AnimateTransformer"]
