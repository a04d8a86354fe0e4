"""The latents distillation denoises, stream by stream, and the distribution-matching formula.

Most families denoise one array of latents ``[B, C, F, Y, X]``. A family with
:meth:`~ditax.models.base.ModelFamily.noised_entries` (LTX-2: ``audio_latents [B, La, Ca]``)
denoises further streams in the same call at the same noise level. Distillation then works on
**joint latents** ``z``: the plain latents array when the family has no further stream (so
those families' arithmetic is unchanged, op for op), else a dict ``{"latents": x, name:
stream, ...}``. Every Euler step, noising and clean estimate applies to each stream alike
(one ``σ`` per sample for all of them, the main latents' loss mask only on the main latents).

Noise draws: the main latents' noise from the key itself (as before streams existed), stream
``i``'s (in ``noised_entries`` order) from ``fold_in(key, i + 1)`` — the rule of
:func:`ditax.train.loss.joint_flow_loss`.

The DMD rule on several streams (:func:`joint_dmd`), as the flow loss sums its streams: each
stream gets its own distribution-matching gradient ``g_s = (f_s - r_s) / mean_s|x̂0_s - r_s|``
(the per-sample normaliser over that stream's elements only, so the audio's scale is not
set by the video's), its own loss ``½·mean_s((x̂0_s - sg(x̂0_s - g_s))²)`` (a mean over its own
elements), and the student's loss is the sum of the streams' losses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MAIN = "latents"


def dmd_gradient(x0, real, fake, mask=None):
    """The distribution-matching gradient ``(fake - real) / mean|x0 - real|`` per sample
    (the mean over the elements ``mask`` keeps), non-finite entries zeroed."""
    axes = tuple(range(1, x0.ndim))
    diff = jnp.abs(x0 - real)
    if mask is None:
        scale = jnp.mean(diff, axis=axes, keepdims=True)
    else:
        m = jnp.broadcast_to(mask.astype(diff.dtype), diff.shape)
        scale = jnp.sum(diff * m, axis=axes, keepdims=True) / jnp.sum(m, axis=axes,
                                                                     keepdims=True)
    return jnp.nan_to_num((fake - real) / scale)


def dmd_loss(x0, grad, mask=None):
    """``½·mean((x0 - sg(x0 - grad))²)``: its gradient with respect to ``x0`` is ``grad``
    over the element count (the elements ``mask`` keeps)."""
    sq = jnp.square(x0 - jax.lax.stop_gradient(x0 - grad))
    if mask is None:
        return 0.5 * jnp.mean(sq)
    m = jnp.broadcast_to(mask.astype(sq.dtype), sq.shape)
    return 0.5 * jnp.sum(sq * m) / jnp.sum(m)


def joint_dmd(x0, real, fake, mask=None):
    """``(loss, {stream: (loss, gradient)})`` of joint latents: per stream
    :func:`dmd_gradient` and :func:`dmd_loss` (``mask`` on the main latents only), the loss
    their sum. ``x0`` carries the gradient; ``real`` and ``fake`` none."""
    if not isinstance(x0, dict):
        grad = dmd_gradient(jax.lax.stop_gradient(x0), real, fake, mask)
        loss = dmd_loss(x0, grad, mask)
        return loss, {MAIN: (loss, grad)}
    parts = {}
    for name in x0:
        m = mask if name == MAIN else None
        grad = dmd_gradient(jax.lax.stop_gradient(x0[name]), real[name], fake[name], m)
        parts[name] = (dmd_loss(x0[name], grad, m), grad)
    return sum(p[0] for p in parts.values()), parts


def joint_data(batch: dict, names: tuple[str, ...]):
    """The batch's clean joint latents: ``batch["latents"]``, or with further streams
    ``names`` the dict of them all."""
    if not names:
        return batch[MAIN]
    return {MAIN: batch[MAIN], **{n: batch[n] for n in names}}


def main(z):
    """The main latents of joint latents ``z``."""
    return z[MAIN] if isinstance(z, dict) else z


def normal(key, z, streams: tuple[str, ...] = (), cast: bool = False):
    """Standard normal noise like ``z``, float32 (``cast``: in each stream's dtype): the main
    latents' from ``key``, those of ``streams[i]`` (the family's ``noised_entries`` order; a
    dict's own order is not kept by ``jax.tree.map``) from ``fold_in(key, i + 1)``."""
    def draw(k, x):
        eps = jax.random.normal(k, x.shape, jnp.float32)
        return eps.astype(x.dtype) if cast else eps
    if not isinstance(z, dict):
        return draw(key, z)
    if set(z) != {MAIN, *streams}:
        raise ValueError(f"joint latents {sorted(z)}: expected {MAIN} and {list(streams)}")
    return {MAIN: draw(key, z[MAIN]),
            **{n: draw(jax.random.fold_in(key, i + 1), z[n]) for i, n in enumerate(streams)}}


def per_sample(sigma, x):
    """``sigma [B]`` shaped to broadcast against ``x [B, ...]``."""
    return sigma.reshape((-1,) + (1,) * (x.ndim - 1))


def mix(x0, eps, sigma):
    """``(1 - σ)·x0 + σ·ε`` on every stream, ``σ [B]`` per sample."""
    return jax.tree.map(lambda a, e: (1 - per_sample(sigma, a)) * a + per_sample(sigma, a) * e,
                        x0, eps)


def cast_like(z, like):
    """``z`` with each stream in the dtype of ``like``'s."""
    return jax.tree.map(lambda a, b: a.astype(b.dtype), z, like)


def f32(z):
    """Every stream as float32."""
    return jax.tree.map(lambda a: a.astype(jnp.float32), z)


def euler(x, v, ds):
    """One Euler step ``x + ds·v`` in float32 on every stream, back in ``x``'s dtypes."""
    return jax.tree.map(lambda a, b: (a.astype(jnp.float32) + ds * b.astype(jnp.float32)
                                      ).astype(a.dtype), x, v)


def clean(x, v, sigma, mask, x_data):
    """The clean estimate ``x - σ·v`` of every stream; on the main latents the elements
    outside the loss ``mask`` (a given frame) are the data's."""
    def one(a, b, data, m):
        x0 = a - per_sample(sigma, a) * b
        if m is None:
            return x0
        m = jnp.broadcast_to(m.astype(x0.dtype), x0.shape)
        return m * x0 + (1 - m) * data
    if not isinstance(x, dict):
        return one(x, v, x_data, mask)
    return {n: one(x[n], v[n], x_data[n], mask if n == MAIN else None) for n in x}


__all__ = ["MAIN", "cast_like", "clean", "dmd_gradient", "dmd_loss", "euler", "f32",
           "joint_data", "joint_dmd", "main", "mix", "normal", "per_sample"]
