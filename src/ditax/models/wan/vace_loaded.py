"""What ``ditax.load_transformer`` returns for a ``WanVACETransformer3DModel`` folder: the
jitted, mesh-aware callable around :class:`~ditax.models.wan.vace.WanVaceTransformer`
(loaded by :func:`ditax.models.wan.loading.load_transformer`, which dispatches on the folder's
``_class_name``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.common.loaded import LoadedTransformer


def _forward(gdef, state, latents, t, text, text_mask, control, scale):
    return nnx.merge(gdef, state)(latents, t, text, text_mask, None, control, scale)


_forward_jit = jax.jit(_forward, static_argnums=0)


@jax.tree_util.register_pytree_node_class
class VaceTransformer(LoadedTransformer):
    """``tr(latents [B, C, F, Y, X], timestep [B], text [B, T, Dt], control_hidden_states=
    [B, C_v, F, Y, X], control_hidden_states_scale=[n] | None) → [B, C, F, Y, X]``, diffusers'
    ``WanVACETransformer3DModel`` call (a pytree like the plain Wan callable)."""

    def __call__(self, latents, timestep, encoder_hidden_states, text_mask=None,
                 encoder_hidden_states_image=None, control_hidden_states=None,
                 control_hidden_states_scale=None):
        latents = jnp.asarray(latents)
        text = jnp.asarray(encoder_hidden_states)
        if encoder_hidden_states_image is not None:
            raise ValueError("encoder_hidden_states_image: this VACE transformer has no image "
                             "embedder (image_dim=None); drop it")
        control = None if control_hidden_states is None else jnp.asarray(control_hidden_states)
        scale = control_hidden_states_scale
        scale = None if scale is None else jnp.asarray(scale, jnp.float32)
        self.module.check_inputs(latents, jnp.asarray(timestep), text, text_mask)
        self.module.check_control(latents, control, scale)
        t = jnp.asarray(timestep, jnp.float32)
        t = jnp.broadcast_to(t, (latents.shape[0],) + t.shape[1:] if t.ndim == 2
                             else (latents.shape[0],))
        if scale is not None and scale.ndim == 1:
            scale = jnp.broadcast_to(scale, (latents.shape[0], scale.shape[0]))
        args = [self._place(latents), self._place(t), self._place(text),
                None if text_mask is None else self._place(jnp.asarray(text_mask, bool)),
                self._place(control), self._place(scale)]
        return _forward_jit(self._gdef, self._state, *args)


__all__ = ["VaceTransformer"]
