"""DMD2's optional GAN term (``distill.gan_weight`` > 0): a small discriminator head on the
critic's block features (the mean token the blocks hand the output head), as a mixin of
:class:`~ditax.train.distill.DistillTrainer`.

The head is ``silu(f·W1 + b1)·W2 + b2`` on RMS-normalised features ``f [B, D]``: 256 hidden
units, ``W1`` scaled ``1/sqrt(D)`` and the output layer zero at the start (the term starts at
``softplus(0)``); it is replicated, trained by the critic's optimiser beside the critic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ditax.train.loss import NUM_TRAIN_TIMESTEPS


class GanHead:
    """The head's pieces; the trainer gives ``cfg``, ``mesh``, ``family``, ``score_model``,
    ``params_abstract``, ``frozen_abstract``, ``state_sh``, ``condition_keys`` and
    ``_shapes``."""

    def _feature_dim(self) -> int:
        """The width of the critic's block features, traced abstractly on one sample."""
        if self._shapes is None:
            raise RuntimeError("bind_data(data) first: the GAN head's width follows the data")
        latent_shape, text_shape = self._shapes
        n = self.mesh.shape["data"] * self.mesh.shape["fsdp"]     # one sample per batch shard
        condition = {k: jnp.zeros((n, *v), jnp.float32)
                     for k, v in self.family.condition_shapes(latent_shape).items()} or None

        def feats(params, frozen):
            module = self.score_model(params, frozen)
            return self.family.apply_with_features(
                module, jnp.zeros((n, *latent_shape), jnp.float32), jnp.zeros((n,)),
                jnp.zeros((n, *text_shape), jnp.float32), jnp.ones((n, text_shape[0]), bool),
                condition)[1]
        return int(jax.eval_shape(feats, self.params_abstract, self.frozen_abstract).shape[-1])

    def _head_init(self) -> dict:
        d, hidden = self._feature_dim(), 256
        k = jax.random.PRNGKey(self.cfg.seed ^ 0x6A17)
        return {"w1": jax.random.normal(k, (d, hidden), jnp.float32) / np.sqrt(d),
                "b1": jnp.zeros((hidden,), jnp.float32),
                "w2": jnp.zeros((hidden, 1), jnp.float32), "b2": jnp.zeros((1,), jnp.float32)}

    def _head_abstract(self) -> dict:
        if not self.gan:
            return {}
        rep = self.state_sh["head"]
        head = jax.eval_shape(self._head_init)
        return {"head": jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), head)}

    @staticmethod
    def discriminate(head: dict, features):
        """Logits ``[B]`` of the head on features ``[B, D]`` (RMS-normalised)."""
        f = features * jax.lax.rsqrt(jnp.mean(jnp.square(features), -1, keepdims=True) + 1e-6)
        return (jax.nn.silu(f @ head["w1"] + head["b1"]) @ head["w2"] + head["b2"])[:, 0]

    def fake_features(self, fake, frozen, batch, x, sigma):
        """``(velocity, features, loss mask)`` of the critic on ``x`` at ``sigma [B]``."""
        condition = {k: batch[k] for k in self.condition_keys} or None
        t = sigma * NUM_TRAIN_TIMESTEPS
        x_in, t_in, mask = self.family.training_inputs(x, batch["latents"], t, condition)
        v, f = self.family.apply_with_features(self.score_model(fake, frozen), x_in, t_in,
                                               batch["text"],
                                               batch["text_mask"].astype(bool), condition)
        return v, f, mask


__all__ = ["GanHead"]
