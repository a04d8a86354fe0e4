"""What FLUX.1's and FLUX.2's transformer loaders share (:mod:`ditax.models.flux.loading`,
:mod:`ditax.models.flux2.loading`): the one loader built from the family's data
(:func:`joint_loader`), its size lines, and the base of the callable ``ditax.load_transformer``
returns (:class:`JointTransformerModel`: the inputs as arrays, checked, then placed on the
batch shards).
"""

from __future__ import annotations

import jax.numpy as jnp

from ditax.models.common.loaded import LoadedTransformer
from ditax.models.common.loader import Architecture, TransformerLoader, plain_weights


def describe(cfg) -> str:
    """The model's size for the load log."""
    return f"{cfg.num_layers} + {cfg.num_single_layers} layers, D={cfg.inner_dim}"


def blocks_summary(cfg) -> str:
    """The model's blocks and width (a checked single file's summary)."""
    return (f"{cfg.num_layers} double + {cfg.num_single_layers} single blocks, "
            f"D={cfg.inner_dim}")


def folder_summary(cfg) -> str:
    """The model's blocks, width and heads (a checked folder's summary)."""
    return (f"{blocks_summary(cfg)}, {cfg.num_attention_heads} heads x "
            f"{cfg.attention_head_dim}")


def joint_loader(family: str, config_class, build, convert, wrapper, check_transformer,
                 lora_names, single_file_config, open_weights=plain_weights):
    """The family's :class:`~ditax.models.common.loader.TransformerLoader`: one
    architecture (``config_class.CLASS_NAME``; ``build``: the module with ``abstract_model``,
    ``convert``: the one with ``weight_table`` and ``param_axes``; ``wrapper``: the
    :class:`JointTransformerModel` returned)."""
    return TransformerLoader(
        family=family,
        architectures=(Architecture(config_class.CLASS_NAME, config_class,
                                    build.abstract_model, convert.weight_table,
                                    convert.param_axes, wrapper),),
        check_transformer=check_transformer,
        single_file_config=single_file_config,
        lora_names=lora_names,
        describe=describe,
        open_weights=open_weights,
    )


class JointTransformerModel(LoadedTransformer):
    """The base of FLUX.1's and FLUX.2's loaded callables (a pytree of the parameters: the
    family's subclass is registered with ``jax.tree_util.register_pytree_node_class`` and
    adds ``__call__`` in diffusers' argument order)."""

    @staticmethod
    def arrays(hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, guidance,
               text_mask) -> tuple:
        """The call's inputs as arrays (timestep and guidance float32, the mask bool)."""
        x, text = jnp.asarray(hidden_states), jnp.asarray(encoder_hidden_states)
        img_ids, txt_ids = jnp.asarray(img_ids), jnp.asarray(txt_ids)
        t = jnp.asarray(timestep, jnp.float32)
        g = None if guidance is None else jnp.asarray(guidance, jnp.float32)
        mask = None if text_mask is None else jnp.asarray(text_mask, bool)
        return x, text, t, img_ids, txt_ids, g, mask

    def placed(self, x, t, g) -> tuple:
        """The (checked) timestep and guidance broadcast to ``x``'s batch ``[B]``, each on the
        batch shards."""
        b = x.shape[0]
        t = jnp.broadcast_to(t, (b,))
        g = None if g is None else jnp.broadcast_to(g, (b,))
        return self._place(t), self._place(g)


__all__ = ["JointTransformerModel", "blocks_summary", "describe", "folder_summary",
           "joint_loader"]
