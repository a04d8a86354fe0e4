"""Rectified-flow objective as Wan trains it.

A clean latent ``x0`` and noise ``ε`` are mixed at noise level ``σ ∈ (0, 1)``:
``x_t = (1 - σ)·x0 + σ·ε``; the model sees ``timestep = 1000·σ`` and predicts the velocity
``ε - x0``. ``σ`` comes from a sampler (uniform or logit-normal) followed by the Wan shift
``σ' = s·σ / (1 + (s - 1)·σ)``, which moves mass towards high noise for large videos.

Optional weighting ``bell`` multiplies each sample's loss by a bell curve in ``σ`` that is
normalised analytically (its mean over a uniform ``σ`` is 1) rather than over the batch, so it
is well defined and unchanged at batch size 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ditax.config import FlowConfig
from ditax.schedulers.flow import add_flow_noise, shift_sigma

NUM_TRAIN_TIMESTEPS = 1000.0
_EPS = 1e-5  # keeps σ away from the exact ends, where x_t is pure data / pure noise


def sample_sigmas(key: jax.Array, batch: int, cfg: FlowConfig) -> jax.Array:
    """Noise levels ``[B]`` float32 in ``(0, 1)`` from the configured sampler, then shifted."""
    if cfg.timestep_sampler == "uniform":
        u = jax.random.uniform(key, (batch,), jnp.float32)
    elif cfg.timestep_sampler == "logit_normal":
        z = jax.random.normal(key, (batch,), jnp.float32)
        u = jax.nn.sigmoid(cfg.logit_mean + cfg.logit_std * z)
    else:
        raise ValueError(f"flow.timestep_sampler={cfg.timestep_sampler!r}: use uniform or "
                         f"logit_normal")
    u = jnp.clip(u, _EPS, 1.0 - _EPS)
    return shift_sigma(u, cfg.shift)


def loss_weights(sigma: jax.Array, weighting: str) -> jax.Array:
    """Per-sample weights ``[B]``. ``bell``: ``6·σ·(1-σ)`` (mean 1 over uniform σ, no batch norm)."""
    if weighting == "none":
        return jnp.ones_like(sigma)
    if weighting == "bell":
        return 6.0 * sigma * (1.0 - sigma)
    raise ValueError(f"flow.weighting={weighting!r}: use none or bell")


def noisy_input(x0: jax.Array, noise: jax.Array, sigma: jax.Array):
    """``x_t`` and the velocity target for latents ``[B, C, F, Y, X]`` and ``σ [B]``."""
    return add_flow_noise(x0, noise, sigma), noise - x0


def flow_loss(apply_fn, x0: jax.Array, text: jax.Array, text_mask, key: jax.Array,
              cfg: FlowConfig, inputs_fn=None) -> jax.Array:
    """Scalar weighted MSE between ``apply_fn(x_t, 1000·σ, text, text_mask)`` and ``ε - x0``.

    ``x0 [B, C, F, Y, X]`` float32, ``text [B, T, Dt]``. The mean is over every element, then
    weighted per sample, so batch size does not change the scale of the loss.
    ``inputs_fn(x_t, x0, timestep) -> (x_t, timestep, mask)`` lets a model family change what
    the denoiser sees (Wan 2.2 TI2V: the clean first frame, per-token timesteps); ``mask``
    (broadcastable to ``x0``, or None) keeps only those elements in the mean.
    """
    loss, _ = joint_flow_loss(lambda x, t, text, mask, _: apply_fn(x, t, text, mask), x0, {},
                              text, text_mask, key, cfg, inputs_fn)
    return loss


def joint_flow_loss(apply_fn, x0: jax.Array, streams: dict, text: jax.Array, text_mask,
                    key: jax.Array, cfg: FlowConfig, inputs_fn=None, teacher_fn=None):
    """:func:`flow_loss` over the main latents ``x0`` and further ``streams`` (name → clean
    latents ``[B, ...]``, a family's :meth:`~ditax.models.base.ModelFamily.noised_entries`)
    denoised in the same call at the same ``σ`` (LTX-2: the audio latents beside the video's).

    Draws: ``σ`` and the main noise as :func:`flow_loss` draws them (the two halves of
    ``key``), stream ``i``'s noise from ``fold_in(noise key, i + 1)`` in ``streams``' order.
    ``apply_fn(x_t, timestep, text, text_mask, noisy streams)`` returns the main prediction,
    or with streams ``(prediction, {name: prediction})``. Per sample each stream's squared
    error is averaged over its elements (the main one masked as :func:`flow_loss`), the
    averages are summed (the LTX-2 trainer's ``video_loss + audio_loss``) and weighted by
    ``flow.weighting``; the loss is the batch mean. Returns ``(loss, parts)``: ``parts`` maps
    ``"latents"`` and each stream's name to its own weighted batch mean (empty without
    streams), for the metrics.

    ``teacher_fn`` (``flow.target=dense_teacher``; same call and return as ``apply_fn``):
    its prediction at the same ``x_t``, timestep, text and noisy streams, gradient stopped,
    replaces each velocity target ``ε - x0`` (the draws stay those of the data target).
    """
    k_sigma, k_noise = jax.random.split(key)
    b = x0.shape[0]
    sigma = sample_sigmas(k_sigma, b, cfg)
    noise = jax.random.normal(k_noise, x0.shape, jnp.float32).astype(x0.dtype)
    x_t, target = noisy_input(x0, noise, sigma)
    t, mask = sigma * NUM_TRAIN_TIMESTEPS, None
    if inputs_fn is not None:
        x_t, t, mask = inputs_fn(x_t, x0, t)
    noisy, targets = {}, {}
    for i, (name, clean) in enumerate(streams.items()):
        eps = jax.random.normal(jax.random.fold_in(k_noise, i + 1), clean.shape,
                                jnp.float32).astype(clean.dtype)
        noisy[name], targets[name] = noisy_input(clean, eps, sigma)
    out = apply_fn(x_t, t, text, text_mask, noisy)
    pred, preds = (out if streams else (out, {}))
    if teacher_fn is not None:
        taught = jax.lax.stop_gradient(teacher_fn(x_t, t, text, text_mask, noisy))
        target, targets = (taught if streams else (taught, {}))
    if set(preds) != set(streams):
        raise ValueError(f"the denoiser predicted {sorted(preds)} beside the latents; the "
                         f"loss noised {sorted(streams)}")
    weights = loss_weights(sigma, cfg.weighting)
    err = _sample_error(pred, target, mask)
    parts = {}
    total = err
    for name in streams:
        e = _sample_error(preds[name], targets[name], None)
        parts[name] = jnp.mean(e * weights)
        total = total + e
    if streams:
        parts = {"latents": jnp.mean(err * weights), **parts}
    return jnp.mean(total * weights), parts


def _sample_error(pred, target, mask) -> jax.Array:
    """Per-sample mean squared error ``[B]`` over every element (``mask``: only those)."""
    sq = jnp.square(pred.astype(jnp.float32) - target.astype(jnp.float32))
    axes = tuple(range(1, sq.ndim))
    if mask is None:
        return jnp.mean(sq, axis=axes)
    m = jnp.broadcast_to(mask.astype(jnp.float32), sq.shape)
    return jnp.sum(sq * m, axis=axes) / jnp.sum(m, axis=axes)
