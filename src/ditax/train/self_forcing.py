"""Self-Forcing distillation (issue 59, ``distill.method=self_forcing``): DMD2
(:mod:`ditax.train.distill`) of a bidirectional teacher into a causal few-step student that
trains on its own autoregressive rollouts.

The student is the run's model with ``model.causal_chunk=K``, initialised from the teacher
(``init_from`` the bidirectional folder: the same weights, only its self-attention is
block-causal). The real score (the frozen teacher) and the critic (the fake score, also
initialised from the teacher) run the same weights bidirectionally (the model config with
``causal_chunk`` unset): :meth:`SelfForcingTrainer.score_model`.

The student's sample is its own video, made as :class:`~ditax.pipelines.causal.CausalSampler`
makes it: chunk by chunk of ``K`` latent frames, each chunk from its noise in the student's
``S`` Euler steps (the table of :func:`~ditax.train.distill_schedule.student_schedule`)
against the KV cache of the clean chunks before it (the sink + ``sample.context_chunks``
chunks; unset: every earlier chunk), then the clean chunk's keys / values written into the
cache by a forward at t = 0. That whole video is the ``x̂0`` of DMD2's losses, reused as they
are (:class:`~ditax.train.distill_losses.DmdLosses`): the distribution-matching loss against
the guided teacher and the critic, and the critic's flow-matching updates on the student's
rollouts (``distill.critic_updates``, each on a fresh rollout).

Gradient — one random step per rollout (Self-Forcing's ``same_step_across_blocks``): a step
``k`` in ``0..S-1`` is drawn once per rollout (metric ``student_step``); in every chunk the
student's call at step ``k`` carries the gradient, pulled back through its Euler update
``x_{k+1} = x_k + (s_{k+1} - s_k)·G(x_k, s_k)``; the later steps pass it on as the identity
(their calls under stop_gradient); the steps before ``k`` and the cache writes carry none (as
Self-Forcing's ``no_grad`` rollout and cache update). Unlike Self-Forcing, which ends a chunk
at step ``k`` with that call's clean estimate, every chunk runs all ``S`` steps: the video
trained on is the video the sampler makes (equal to CausalSampler's for the same noise and
weights), at the price of the later steps' forwards and, in the student's rollout, of step
``k``'s call made twice (without, then with the gradient:
:meth:`SelfForcingTrainer.causal_rollout`).

Long rollouts (``distill.rollout_chunks`` N > 0; Self-Forcing++'s long-horizon training): a
student trained on rollouts of the teacher's length meets, past it, a KV cache it never saw
(the first chunks evicted, the sink far behind) and drifts. With N set, each rollout (the
student's and the critic's) is N chunks long, past the data's ``W`` chunks, and a window of
``W`` chunks starting at a chunk drawn uniformly from ``0..N-W`` (from the rollout's key:
:meth:`SelfForcingTrainer.window_start`; resume stays bit-exact) is the video the losses
see: the bidirectional teacher and the critic judge it as a clip of the teacher's length,
so a later window is pushed to look like a whole teacher clip (the prompt's object, its
motion). The chunks before the window run without gradient (their cache writes are the
window's context, as the sampler leaves it: the sink + ``sample.context_chunks``); the
chunks after it are not run; the window's chunks carry the gradient as above. 0 (the
default): the rollout is the data's length, the step as before.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.config import Config, ConfigError
from ditax.models import registry
from ditax.models.base import model_family
from ditax.train import distill_streams as S
from ditax.train.distill import DistillTrainer
from ditax.train.loss import NUM_TRAIN_TIMESTEPS


def check_self_forcing(cfg: Config) -> None:
    """One :class:`ConfigError` line for a run ``distill.method=self_forcing`` cannot make:
    a family without a causal transformer, a student config that is not causal, and the
    settings the causal rollout does not take."""
    d, name = cfg.distill, getattr(cfg.model, "family", registry.DEFAULT_FAMILY)
    registry.require(name, "causal", "distill.method=self_forcing",
                     "distil a causal student of a family that has one, or use "
                     "distill.method=dmd2")
    chunk = getattr(cfg.model, "causal_chunk", None)
    refusals = (
        (chunk is None, "trains a causal student: set model.causal_chunk=K (latent frames "
                        "per chunk; init_from the bidirectional teacher, whose weights it "
                        "starts from)"),
        (cfg.lora.rank > 0, f"trains the whole student; lora.rank={cfg.lora.rank} is not "
                            f"supported with it, set lora.rank=0"),
        (d.gan_weight > 0, f"has no GAN term; distill.gan_weight={d.gan_weight:g}: set "
                           f"distill.gan_weight=0"),
        (d.expert != "all", f"distils one causal student over all its steps; "
                            f"distill.expert={d.expert}: set distill.expert=all"),
        (not d.backward_simulation, "always trains on the student's own rollout; "
                                    "distill.backward_simulation=false: set it true"),
        (cfg.sample.cache is not None, f"samples a few steps per chunk with no step cache; "
                                       f"sample.cache={cfg.sample.cache}: set sample.cache="
                                       f"none"),
        (cfg.attention.sparsity != "none",
         f"trains a block-causal student over frame-major tokens; attention.sparsity="
         f"{cfg.attention.sparsity} lays them out tile-major: set attention.sparsity=none "
         f"(a sparse student: distill.method=dmd2)"),
    )
    for bad, why in refusals:
        if bad:
            raise ConfigError(f"distill.method=self_forcing {why}")


class SelfForcingTrainer(DistillTrainer):
    """:class:`~ditax.train.distill.DistillTrainer` (same state, step, resume) whose student
    samples its video causally, chunk by chunk (see the module docstring)."""

    method = "self_forcing"

    def __init__(self, cfg: Config, mesh):
        check_self_forcing(cfg)
        super().__init__(cfg, mesh)
        self.kv = self.family.kv_cache()
        self.chunk = int(cfg.model.causal_chunk)
        bidirectional = model_family(dataclasses.replace(cfg.model, causal_chunk=None),
                                     cfg.attention, cfg.flow)
        self._score_graph = nnx.split(bidirectional.abstract(mesh))

    def score_model(self, params: dict, frozen: dict):
        """The teacher's and the critic's module: the weights ``params`` run bidirectionally."""
        graphdef, abstract = self._score_graph
        st = jax.tree.map(lambda x: x, abstract)
        nnx.replace_by_pure_dict(st, params)
        return nnx.merge(graphdef, st)

    @property
    def flops_factor(self) -> float:
        """Over one training step's 3 forwards: a rollout is ``S + 1`` forwards of the video
        (the steps, the cache writes); the student's adds step ``k`` again and its backward
        (3), the teacher (2 with guidance) and the critic (1); each critic update the
        critic's forward and backward (3)."""
        d = self.cfg.distill
        rollout = (d.steps + 1) * self.rollout_share()
        student = rollout + 3 + (2 if d.guidance != 1 else 1) + 1
        return (d.critic_updates * (rollout + 3) + student) / 3

    def rollout_share(self) -> float:
        """A rollout's mean chunks over the window's: 1, or with ``distill.rollout_chunks``
        N (the window ``W`` chunks after a prefix of ``0..N-W``) ``(W + (N-W)/2) / W``."""
        n = self.cfg.distill.rollout_chunks
        if not n or self._shapes is None:
            return 1.0
        w = self._shapes[0][1] // self.chunk
        return (w + (n - w) / 2) / w

    def bind_data(self, data) -> None:
        """DMD2's, and every batch shape's latent frames whole chunks within RoPE's table."""
        n = self.cfg.distill.rollout_chunks
        for shape in getattr(data, "latent_shapes", (data.latent_shape,)):
            self.window(shape[1])
            if n and n * self.chunk < shape[1]:
                raise ConfigError(f"distill.rollout_chunks={n} ({n * self.chunk} latent "
                                  f"frames) is shorter than the data's {shape[1]} latent "
                                  f"frames; set it to at least {-(-shape[1] // self.chunk)} "
                                  f"(or 0: the data's length)")
        if n:
            self.window(n * self.chunk)
        super().bind_data(data)

    def window(self, frames: int) -> int:
        """The KV cache's chunks beside the sink for ``frames`` latent frames:
        ``sample.context_chunks``, else every earlier chunk; one line when the frames are no
        whole number of chunks or run past RoPE's frame positions."""
        m = self.cfg.model
        context = self.cfg.sample.context_chunks
        self.kv.check_causal(self.chunk, context, m.patch_size[0], frames=frames)
        n = frames // self.chunk
        self.kv.check_length(m, self.chunk, n, what=f"data latent frames={frames}")
        return context if context is not None else max(n - 1, 1)

    def causal_rollout(self, params, frozen, batch, noise, sig, k, start=None, frames=None):
        """The student's video ``[B, C, F, Y, X]`` (float32) from ``noise``: chunk by chunk,
        ``S`` Euler steps on the sigma table ``sig [S+1]`` against the KV cache, the clean
        chunk written at t = 0; the gradient with respect to ``params`` through step ``k``
        (traced) of each chunk only (None: no gradient taken, the video alone).

        Each chunk's steps run without gradient (the value: the sampler's), keeping step
        ``k``'s input; that step's call is made again with the gradient, and its update's
        difference to itself (zero) added to the chunk (so the chunk's value stays the loop's,
        its gradient that update's). One scan over the chunks, the cache its carry.

        A long rollout's window: ``noise`` holds every chunk of the long video, ``start``
        (traced) is the window's first chunk and ``frames`` (static) its latent frames; the
        chunks before it run without gradient (only the cache they leave is kept), those
        after it are not run; the window's video ``[B, C, frames, Y, X]`` comes back."""
        kv, chunk, steps = self.kv, self.chunk, sig.shape[0] - 1
        b, c, total, y, x = noise.shape
        n = total // chunk
        text, mask = batch["text"], batch["text_mask"].astype(bool)
        fixed, sg = jax.lax.stop_gradient(params), jax.lax.stop_gradient
        dtype = jnp.dtype(self.cfg.model.dtype)
        cache = kv.init_cache(self.model(fixed, frozen), b, (chunk, y, x), self.window(total))
        noise = jnp.moveaxis(noise.astype(jnp.float32).reshape(b, c, n, chunk, y, x), 2, 0)

        def velocity(p, z, s, cache):
            t = jnp.full((b,), s * NUM_TRAIN_TIMESTEPS, jnp.float32)
            out, _ = kv.forward_chunk(self.model(p, frozen), z.astype(dtype), t, text, cache,
                                      text_mask=mask, write=False)
            return out

        def euler(z, v, j):     # the Euler scheduler's step: float32, returned in v's dtype
            return S.euler(z, v, sig[j + 1] - sig[j]).astype(v.dtype).astype(jnp.float32)

        def one_chunk(cache, z0, k):
            def step(j, carry):
                z, z_k = carry
                z_k = z_k if k is None else jnp.where(j == k, z, z_k)
                return euler(z, velocity(fixed, z, sig[j], cache), j), z_k

            z, z_k = (sg(a) for a in jax.lax.fori_loop(0, steps, step, (z0, z0)))
            clean = z
            if k is not None:
                z_next = euler(z_k, velocity(params, z_k, sig[k], cache), k)
                clean = z + (z_next - sg(z_next))
            _, cache = kv.forward_chunk(self.model(fixed, frozen), z.astype(dtype),
                                        jnp.zeros((b,), jnp.float32), text, cache,
                                        text_mask=mask, write=True)
            return sg(cache), clean

        if start is not None:       # the prefix: its cache writes only, no gradient
            cache = jax.lax.fori_loop(0, start, lambda i, cc: one_chunk(cc, noise[i], None)[0],
                                      cache)
            total = frames
            noise = jax.lax.dynamic_slice_in_dim(noise, start, frames // chunk, axis=0)
        _, out = jax.lax.scan(lambda cc, z0: one_chunk(cc, z0, k), cache, noise)
        video = jnp.moveaxis(out, 0, 2).reshape(b, c, total, y, x)     # out [n, B, C, K, Y, X]
        return jax.lax.with_sharding_constraint(video, self.batch_sh["latents"])   # the data's

    def window_start(self, key, frames: int):
        """A long rollout's window (``distill.rollout_chunks``): its first chunk, uniform in
        ``0..N-W`` (``W`` the chunks of ``frames``), from ``fold_in(key, 3)`` (the rollout's
        own key: the step's stream, so resume repeats it)."""
        last = self.cfg.distill.rollout_chunks - frames // self.chunk
        return jax.random.randint(jax.random.fold_in(key, 3), (), 0, last + 1)

    def student_sample(self, params, frozen, batch, key, sig, grad: bool = True):
        """``(video, None, k, None)``: the student's causal rollout from fresh noise with the
        gradient through step ``k`` (drawn uniformly from ``0..S-1``), in the place of DMD2's
        clean estimate at a random step (the losses take it as they are); ``grad`` False (the
        critic's samples): the video alone, step ``k`` not run again. With
        ``distill.rollout_chunks``: the window of the data's length from a long rollout
        (:meth:`window_start`), the same shape."""
        k_step, k_noise = jax.random.split(key)
        sig = jnp.asarray(sig, jnp.float32)
        k = jax.random.randint(k_step, (), 0, self.cfg.distill.steps)
        long = self.cfg.distill.rollout_chunks
        if not long:
            noise = S.normal(k_noise, batch["latents"])
            video = self.causal_rollout(params, frozen, batch, noise, sig, k if grad else None)
            return video, None, k, None
        b, c, frames, y, x = batch["latents"].shape
        noise = jax.random.normal(k_noise, (b, c, long * self.chunk, y, x), jnp.float32)
        video = self.causal_rollout(params, frozen, batch, noise, sig, k if grad else None,
                                    start=self.window_start(key, frames), frames=frames)
        return video, None, k, None

    def student_video(self, params, frozen, batch, noise, sig):
        """The previews' sample: the causal rollout (no gradient taken)."""
        return self.causal_rollout(params, frozen, batch, S.main(noise).astype(jnp.float32),
                                   jnp.asarray(sig, jnp.float32), None)


__all__ = ["SelfForcingTrainer", "check_self_forcing"]
