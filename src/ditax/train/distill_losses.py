"""The pieces of a DMD2 distillation step (:mod:`ditax.train.distill`), each a function of
explicit inputs, tested one by one: the denoisers (student, critic, the guided teacher) on
joint latents, the student's rollout and clean estimate, the steps and noise levels an expert
trains, and the two losses — the student's distribution-matching loss (plus the GAN term) and
the critic's flow-matching loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ditax.config import ConfigError
from ditax.config.training import distill_sigmas
from ditax.schedulers.flow import shift_sigma
from ditax.train import distill_streams as S
from ditax.train.distill_schedule import student_schedule, student_shift
from ditax.train.loss import NUM_TRAIN_TIMESTEPS, flow_loss, joint_flow_loss


class DmdLosses:
    """The step's pieces; the trainer (:class:`~ditax.train.distill.DistillTrainer`) gives
    ``cfg``, ``family``, ``streams``, ``condition_keys``, ``terminal``, ``model`` (the
    student's module), ``score_model`` (the critic's and the teacher's) and the GAN
    head's ``fake_features`` / ``discriminate`` (:class:`~ditax.train.distill_gan.GanHead`)."""

    def denoiser(self, module, batch):
        """``v(z, sigma [B]) -> (velocity, loss mask or None)`` of ``module`` on joint latents
        ``z`` (:mod:`ditax.train.distill_streams`: the latents, or with further streams the
        dict of them all, velocities alike), the batch's text and condition, the family's
        training inputs applied (the data latents give a condition frame). ``module``: a
        thunk that builds the NNX module, called inside each call (a module must not cross
        into a loop's trace)."""
        condition = {k: batch[k] for k in self.condition_keys} or None
        x_data = batch["latents"]
        text, mask = batch["text"], batch["text_mask"].astype(bool)
        streams = self.streams

        def v(z, sigma):
            t = sigma * NUM_TRAIN_TIMESTEPS
            x_in, t_in, loss_mask = self.family.training_inputs(S.main(z), x_data, t, condition)
            if not streams:
                return self.family.apply(module(), x_in, t_in, text, mask, condition), loss_mask
            # the noisy streams in place of the batch's clean ones
            noisy = {**condition, **{n: z[n] for n in streams}}
            out, more = self.family.apply(module(), x_in, t_in, text, mask, noisy)
            return {S.MAIN: out, **{n: more[n] for n in streams}}, loss_mask
        return v

    def guided(self, module, batch, null, guidance: float):
        """The teacher's classifier-free guided velocity ``v_u + g·(v_c - v_u)`` (every
        stream at the one scale), ``v_u`` on the empty prompt (``null``: its text, mask and
        extra condition entries)."""
        cond = self.denoiser(module, batch)
        if guidance == 1.0:
            return cond
        b = batch["latents"].shape[0]
        uncond_batch = dict(batch)
        for k, val in null.items():
            if k in batch:
                uncond_batch[k] = jnp.broadcast_to(val[None], (b,) + val.shape).astype(
                    batch[k].dtype)
        uncond = self.denoiser(module, uncond_batch)

        def v(x, sigma):
            vc, m = cond(x, sigma)
            vu, _ = uncond(x, sigma)
            return jax.tree.map(lambda c, u: u + guidance * (c - u), vc, vu), m
        return v

    def clean(self, x, v, sigma, mask, x_data):
        """``x - σ·v`` on every stream; the main latents' elements outside the loss mask (a
        given frame) from the data."""
        return S.clean(x, v, sigma, mask, x_data)

    def rollout(self, student_v, noise, sig, k):
        """The student's Euler steps ``0..k-1`` from ``noise`` (``k`` traced): ``x_k``."""
        b = S.main(noise).shape[0]

        def body(j, x):
            v, _ = student_v(x, jnp.full((b,), sig[j], jnp.float32))
            return S.euler(x, v, sig[j + 1] - sig[j])
        return jax.lax.fori_loop(0, k, body, noise)

    def student_sample(self, params, frozen, batch, key, sig, grad: bool = True):
        """``(x̂0, x_k, k, loss mask)``: the student's clean estimate at a random step ``k``
        from its own earlier steps (backward simulation) or from noised data; ``x̂0`` carries
        the gradient with respect to ``params``, the input ``x_k`` none. ``x̂0`` and ``x_k``
        are joint latents (every stream the family denoises). ``grad`` False: no gradient
        will be taken (the critic's sample; a subclass may skip work for it, not this one)."""
        k_step, k_noise = jax.random.split(key)
        sig = jnp.asarray(sig, jnp.float32)
        steps = jnp.asarray(self.expert_steps(self.schedule_table(batch["latents"].shape[1:])),
                            jnp.int32)
        k = steps[jax.random.randint(k_step, (), 0, steps.shape[0])]
        z_data = S.joint_data(batch, self.streams)
        noise = S.normal(k_noise, z_data, self.streams, cast=True)
        if self.cfg.distill.backward_simulation:
            fixed = jax.lax.stop_gradient(params)
            frozen_v = self.denoiser(lambda: self.model(fixed, frozen), batch)
            x_k = self.rollout(frozen_v, noise, sig, k)
        else:
            s = sig[k]
            x_k = jax.tree.map(lambda d, n: ((1 - s) * d.astype(jnp.float32)
                                             + s * n.astype(jnp.float32)).astype(d.dtype),
                               z_data, noise)
        x_k = jax.lax.stop_gradient(x_k)
        b = batch["latents"].shape[0]
        s_k = jnp.full((b,), sig[k], jnp.float32)
        v, mask = self.denoiser(lambda: self.model(params, frozen), batch)(x_k, s_k)
        return self.clean(S.f32(x_k), S.f32(v), s_k, mask, S.f32(z_data)), x_k, k, mask

    def expert_steps(self, sig) -> tuple[int, ...]:
        """The student steps this run trains: all, or (two experts) those whose timestep is
        at / above (``high``) or below (``low``) the boundary."""
        d = self.cfg.distill
        n = d.steps
        if d.expert == "all":
            return tuple(range(n))
        sig = np.asarray(sig)
        high = tuple(k for k in range(n) if sig[k] * NUM_TRAIN_TIMESTEPS
                     >= d.boundary * NUM_TRAIN_TIMESTEPS)
        steps = high if d.expert == "high" else tuple(k for k in range(n) if k not in high)
        if not steps:
            raise ConfigError(f"distill.expert={d.expert}: none of the student's timesteps "
                              f"{[round(float(x) * 1000, 1) for x in sig[:-1]]} is "
                              f"{'at or above' if d.expert == 'high' else 'below'} "
                              f"distill.boundary={d.boundary:g} x 1000; change distill.sigmas "
                              f"or distill.shift")
        return steps

    def critic_range(self, shift: float) -> tuple[float, float]:
        """The critic's noise levels before the shift: ``[t_min, t_max]``, cut at the
        boundary for an expert (the boundary's unshifted level ``b / (s - (s-1)·b)``)."""
        d = self.cfg.distill
        if d.expert == "all":
            return d.t_min, d.t_max
        b = d.boundary / (shift - (shift - 1.0) * d.boundary)
        return (max(d.t_min, b), d.t_max) if d.expert == "high" else (d.t_min, min(d.t_max, b))

    def critic_sigma(self, key, b, latent_shape):
        shift = float(self.family.training_flow(tuple(latent_shape)).shift)
        lo, hi = self.critic_range(shift)
        u = jax.random.uniform(key, (b,), jnp.float32, lo, hi)
        return shift_sigma(u, shift)

    def generator_loss(self, params, fake, frozen, batch, null, key, sig, head=None):
        """The student's distribution-matching loss (plus, with ``head``, the GAN term) and
        its parts; with further streams the sum of each stream's
        (:func:`ditax.train.distill_streams.joint_dmd`), each stream's term and gradient
        scale among the parts (``dmd_loss_<stream>``, ``dmd_scale_<stream>``)."""
        k_sample, k_sigma, k_noise = jax.random.split(key, 3)
        x0, _, k, mask = self.student_sample(params, frozen, batch, k_sample, sig)
        x0_main = S.main(x0)
        b = x0_main.shape[0]
        sigma = self.critic_sigma(k_sigma, b, x0_main.shape[1:])
        eps = S.normal(k_noise, x0, self.streams)
        x_t = jax.lax.stop_gradient(S.mix(x0, eps, sigma))
        z_data = S.joint_data(batch, self.streams)
        real_v = self.guided(self.teacher(params, frozen), batch, null, self.cfg.distill.guidance)
        fake_fixed = jax.lax.stop_gradient(fake)
        x_in = S.cast_like(x_t, z_data)
        vr, _ = real_v(x_in, sigma)
        parts = {}
        if head is None:
            fake_v = self.denoiser(lambda: self.score_model(fake_fixed, frozen), batch)
            vf, _ = fake_v(x_in, sigma)
        else:   # one critic call: its features carry the gradient to x0, its score does not
            s = S.per_sample(sigma, x0)         # (no further streams: refused with a head)
            x_g = ((1 - s) * x0 + s * eps).astype(batch["latents"].dtype)
            vf, feats, _ = self.fake_features(fake_fixed, frozen, batch, x_g, sigma)
            vf = jax.lax.stop_gradient(vf)
            logits = self.discriminate(jax.lax.stop_gradient(head), feats)
            parts["gan_generator"] = jnp.mean(jax.nn.softplus(-logits))
        data = S.f32(z_data)
        real = jax.lax.stop_gradient(self.clean(x_t, S.f32(vr), sigma, mask, data))
        fake_x0 = jax.lax.stop_gradient(self.clean(x_t, S.f32(vf), sigma, mask, data))
        loss, per = S.joint_dmd(x0, real, fake_x0, mask)
        parts.update(student_step=k, dmd_scale=jnp.mean(jnp.abs(per[S.MAIN][1])), dmd_loss=loss)
        if self.streams:
            for name, (term, grad) in per.items():
                parts[f"dmd_loss_{name}"] = term
                parts[f"dmd_scale_{name}"] = jnp.mean(jnp.abs(grad))
        if head is not None:
            loss = loss + self.cfg.distill.gan_weight * parts["gan_generator"]
        return loss, parts

    def critic_loss(self, fake, params, frozen, batch, key, sig, head=None):
        """The critic's flow-matching loss on a student sample (no gradient to the student),
        on every stream (:func:`~ditax.train.loss.joint_flow_loss`: the student's ``x̂0`` of
        each stream its clean latents); with ``head`` (``fake`` then a pair ``(critic,
        head)``), plus the GAN term's classification of the student's noised sample against
        the noised data."""
        if head is not None:
            fake, head = fake
        k_sample, k_flow, k_gan = jax.random.split(key, 3)
        x0, _, _, _ = self.student_sample(jax.lax.stop_gradient(params), frozen, batch,
                                          k_sample, sig, grad=False)
        x0 = S.cast_like(jax.lax.stop_gradient(x0), S.joint_data(batch, self.streams))
        gan = 0.0
        if head is not None:
            k_sigma, k_noise = jax.random.split(k_gan)
            b = x0.shape[0]
            sigma = self.critic_sigma(k_sigma, b, x0.shape[1:])
            s = sigma.reshape((-1,) + (1,) * (x0.ndim - 1))
            eps = jax.random.normal(k_noise, x0.shape, jnp.float32)
            data = batch["latents"].astype(jnp.float32)
            both = jnp.concatenate([(1 - s) * x0 + s * eps, (1 - s) * data + s * eps])
            pair = {k: jnp.concatenate([v, v]) for k, v in batch.items()}
            _, feats, _ = self.fake_features(fake, frozen, pair, both.astype(x0.dtype),
                                             jnp.concatenate([sigma, sigma]))
            logits = self.discriminate(head, feats)
            gan = self.cfg.distill.gan_critic_weight * (
                jnp.mean(jax.nn.softplus(logits[:b])) + jnp.mean(jax.nn.softplus(-logits[b:])))
        model = self.score_model(fake, frozen)
        condition = {k: batch[k] for k in self.condition_keys} or None

        def inputs(x_t, x0_, t):
            return self.family.training_inputs(x_t, x0_, t, condition)

        x0_main = S.main(x0)
        flow = self.family.training_flow(tuple(x0_main.shape[1:]))
        text, mask = batch["text"], batch["text_mask"].astype(bool)
        if not self.streams:
            def apply(x, t, text, mask):
                return self.family.apply(model, x, t, text, mask, condition)

            return flow_loss(apply, x0, text, mask, k_flow, flow, inputs) + gan

        def joint_apply(x, t, text, mask, noisy):
            return self.family.apply(model, x, t, text, mask, {**condition, **noisy})

        loss, _ = joint_flow_loss(joint_apply, x0_main, {n: x0[n] for n in self.streams}, text,
                                  mask, k_flow, flow, inputs)
        return loss + gan

    def schedule_table(self, latent_shape):
        """The student's sigma table ``[K+1]`` (host numpy, float32;
        :func:`~ditax.train.distill_schedule.student_schedule`, stretched to the sampler's
        terminal sigma where it has one)."""
        _, sig = student_schedule(distill_sigmas(self.cfg.distill),
                                  student_shift(self.cfg, self.family, latent_shape),
                                  self.terminal)
        return np.asarray(sig, np.float32)


__all__ = ["DmdLosses"]
