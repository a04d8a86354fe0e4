"""What ``ditax.load_transformer`` returns for a ``WanAnimateTransformer3DModel`` folder: the
jitted, mesh-aware callable around :class:`~ditax.models.wan.animate.WanAnimateTransformer`
(loaded by :func:`ditax.models.wan.loading.load_transformer`, which dispatches on the folder's
``_class_name``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.common.loaded import LoadedTransformer


def _forward(gdef, state, latents, t, text, text_mask, image, pose, face):
    return nnx.merge(gdef, state)(latents, t, text, text_mask, image, pose, face)


_forward_jit = jax.jit(_forward, static_argnums=0)


@jax.tree_util.register_pytree_node_class
class AnimateTransformer(LoadedTransformer):
    """``tr(latents [B, 2z+4, F, Y, X], timestep [B], text [B, T, Dt],
    encoder_hidden_states_image [B, 257, Di], pose_hidden_states=[B, z, F-1, Y, X],
    face_pixel_values=[B, 3, S, P, P]) → [B, z, F, Y, X]``: diffusers'
    ``WanAnimateTransformer3DModel`` call (a pytree like the plain Wan callable)."""

    def __call__(self, latents, timestep, encoder_hidden_states, text_mask=None,
                 encoder_hidden_states_image=None, pose_hidden_states=None,
                 face_pixel_values=None):
        latents = jnp.asarray(latents)
        text = jnp.asarray(encoder_hidden_states)
        image = (None if encoder_hidden_states_image is None
                 else jnp.asarray(encoder_hidden_states_image))
        pose = None if pose_hidden_states is None else jnp.asarray(pose_hidden_states)
        face = None if face_pixel_values is None else jnp.asarray(face_pixel_values)
        self.module.check_inputs(latents, jnp.asarray(timestep), text, text_mask, image)
        self.module.check_animate_inputs(latents, pose, face)
        t = jnp.broadcast_to(jnp.asarray(timestep, jnp.float32), (latents.shape[0],))
        args = [self._place(a) for a in (latents, t, text)]
        args.append(None if text_mask is None else self._place(jnp.asarray(text_mask, bool)))
        args += [self._place(a) for a in (image, pose, face)]
        return _forward_jit(self._gdef, self._state, *args)


__all__ = ["AnimateTransformer"]
