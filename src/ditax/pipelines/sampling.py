"""The one sampling loop every family's pipeline runs: prompt parts in, latents (or the decoded
output) out.

A family's pipeline checks its request (sizes, defaults, what its folder takes) and hands its
parts out as one :class:`Prepared` (its ``prepare(**call)``; its call is
``prepare(...).run()``, and :mod:`ditax.pipelines.batch` stacks several of one shape);
:func:`sample` (``sample(prepared, progress=, on_step=)``) does the rest, the same for every
family:

1. checks that hold for any model: the per-forward batch of CFG fits the mesh, the step-cache
   request (:mod:`ditax.pipelines.cache`), the shape of given ``latents``;
2. the condition (``condition()``, phase ``condition`` or ``image``) and the text
   (``text(use_cfg)``: ``[2, T, Dt]`` cond, uncond with guidance, else ``[1, T, Dt]``),
   replicated over the mesh;
3. the initial noise (:func:`initial_noise`, from ``seed``) unless ``latents`` are given, the
   scheduler's timesteps, the expert of each step (a second expert below ``boundary``) and its
   guidance scale;
4. ahead of time, before the first step (:mod:`.programs`): one step program per expert
   signature — the plain step (:func:`~ditax.pipelines.denoise._denoise_step`) or the
   step-cached one (:mod:`ditax.pipelines.cache`) — and the decode (``prepare_decode``);
   an expert with ``attention.dense_steps`` runs its first steps as its dense twin, one more
   program (:mod:`ditax.pipelines.sparse_steps`);
5. the loop, then ``finalize(condition, latents)``, the stats (``steps``,
   ``transformer_calls``, ...), and ``decode(latents, prepared)`` unless no decode is given.

The denoiser is reached only through the protocol of :mod:`ditax.models.base`
(:class:`~ditax.models.base.Denoiser`, and the family's
:class:`~ditax.models.base.ModelInputs` rule), so a family with such a module samples here with
CFG, experts, step caching and the compile cache, without a line of its own loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.errors import RequestError
from ditax.finite import all_finite
from ditax.parallel.axes import check_batch_divides
from ditax.phases import phase
from ditax.pipelines.cache.cached_step import extra_branches
from ditax.pipelines.cache.step_cache import check_cache_args, plan_step_cache, uncached_stats
from ditax.pipelines.denoise import CARRY, _denoise_step
from ditax.pipelines.programs import Programs
from ditax.pipelines.sparse_steps import schedule


@dataclass(frozen=True)
class Expert:
    """One denoiser the loop may call: its graph (static, part of the step program's key), its
    parameters, and its config (what step-cache numbers match on)."""

    graphdef: Any
    params: Any
    config: Any = None


@dataclass
class Sampled:
    """What :func:`sample` returns: ``output`` (the decoded output, or the final latents as a
    numpy array without a decode), ``stats`` (``pipe.last_stats``) and ``timings`` (seconds:
    ``text``, ``image``, ``compile``, ``denoise``, ``decode``)."""

    output: Any
    stats: dict
    timings: dict


@dataclass
class Timings:
    """Seconds per phase of the last call (``load`` is set once, by the pipeline's loader;
    ``compile``: ahead-of-time compilation of the step and decode, 0 when already compiled;
    ``image``: the image condition (VAE encode, CLIP) of image-to-video, shown when
    non-zero)."""

    load: float = 0.0
    text: float = 0.0
    denoise: float = 0.0
    decode: float = 0.0
    compile: float = 0.0
    image: float = 0.0

    def line(self) -> str:
        image = f"image {self.image:.2f}s | " if self.image else ""
        return (f"timing: load {self.load:.2f}s | text {self.text:.2f}s | {image}"
                f"compile {self.compile:.2f}s | denoise {self.denoise:.2f}s | "
                f"decode {self.decode:.2f}s")


def initial_noise(seed: int, shape: tuple[int, ...]) -> jax.Array:
    """``jax.random.normal(PRNGKey(seed), shape)``, float32, drawn flat and reshaped: the same
    values (threefry counts elements in row-major order, partitionable or not), but XLA
    compiles the 1-D draw in a fraction of a second where the 5-D one takes seconds on CPU."""
    flat = jax.random.normal(jax.random.PRNGKey(int(seed)), (math.prod(shape),), jnp.float32)
    return flat.reshape(shape)


def replicate(x, mesh):
    """``x`` (a pytree) on every device of ``mesh`` (unchanged without one)."""
    if mesh is None:
        return x
    return jax.device_put(x, NamedSharding(mesh, P()))


def check_cfg_batch(use_cfg: bool, cfg_mode: str, mesh) -> None:
    """The per-forward batch (2 for batched CFG, else 1) must split over the mesh's batch
    axes."""
    b = 2 if (use_cfg and cfg_mode == "batched") else 1
    check_batch_divides(
        b, mesh, "per-forward batch",
        f"cfg_mode={cfg_mode} with guidance {'on' if use_cfg else 'off'} runs batch {b} "
        f"per forward; put the devices on mesh.context (sequence parallel) or use "
        f"cfg_mode=batched with mesh.data*mesh.fsdp <= 2")


def check_finite(tree, phase_name: str, what: str, guidance_scale=None) -> None:
    """Every float array of ``tree`` is finite (:func:`ditax.finite.all_finite`: on CPU,
    numpy where the values are; eager ``isfinite`` / ``all`` compiled two programs per
    shape); else :class:`~ditax.errors.NonFiniteOutput` naming the phase and the likely
    causes — a black video is never a success."""
    from ditax.errors import NonFiniteOutput

    for leaf in jax.tree.leaves(tree):
        if not hasattr(leaf, "dtype") or not jnp.issubdtype(leaf.dtype, jnp.floating):
            continue
        if not all_finite(leaf):
            g = f" (it is {guidance_scale:g})" if guidance_scale is not None else ""
            raise NonFiniteOutput(
                f"{phase_name}: {what} hold NaN / inf, so nothing is written; likely causes: a "
                f"weight file with a non-finite tensor, a LoRA strength too large, or a "
                f"guidance scale too large{g}")


def set_timesteps(scheduler, num_steps: int, shape, sigmas=None):
    """The scheduler's fresh state; explicit ``sigmas`` only on the Euler sampler."""
    if sigmas is None:
        return scheduler.set_timesteps(num_steps, shape)
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler

    if not isinstance(scheduler, FlowMatchEulerScheduler):
        raise RequestError(f"sigmas= needs the Euler sampler; this pipeline runs "
                           f"{type(scheduler).__name__} — load it with "
                           f"scheduler='euler' (sample.scheduler=euler)")
    try:
        return scheduler.set_timesteps(num_steps, shape, sigmas=sigmas)
    except ValueError as e:
        raise RequestError(str(e)) from None


def check_latents(latents, shape: tuple[int, ...], size: str):
    """Given latents as float32 ``shape`` (a missing batch axis added); ``size`` names the
    request in the error (e.g. ``"for 5 frames at 32x32"``)."""
    latents = np.asarray(latents, np.float32)
    if latents.ndim == len(shape) - 1:
        latents = latents[None]
    if tuple(latents.shape) != tuple(shape):
        raise RequestError(f"latents shape {tuple(latents.shape)} does not match "
                           f"{tuple(shape)} {size}")
    return latents


@dataclass(frozen=True)
class Prepared:
    """One request as a pipeline hands it to :func:`sample`, after checking it (its
    ``prepare(**call)``; the runtime fields ``programs``, ``experts``, ``mesh`` and ``cfg_mode``
    come from the pipeline, :meth:`ditax.pipelines.base.Pipeline.prepared`). Nothing in it is
    encoded or compiled yet: ``text``, ``condition``, ``source`` and the decode are callables
    that :func:`sample` runs in their phases.

    The pipeline's own call is ``prepare(...).run(progress)``; a batch of requests
    (:func:`ditax.pipelines.batch.sample_batch`) stacks several of these on the batch axis —
    the one-request contract it relies on: ``latent_shape`` is ``[1, ...]``, ``text(use_cfg)``
    gives rows (cond[, uncond]) on axis 0 of each leaf, and every array of ``condition()``
    starts with this request's own batch axis (1, or 2 for Wan's first-last image pairs).

    Fields:
      programs: the pipeline's compiled programs (:class:`~ditax.pipelines.programs.Programs`).
      experts: one or two :class:`Expert` s; the second runs the steps whose timestep is below
        ``boundary`` (two-expert models; None: the first runs every step).
      inputs: the family's :class:`~ditax.models.base.ModelInputs` rule (module level).
      scheduler: the request's sampler (static: part of the step program's key).
      latent_shape: the initial latents ``[1, C, ...]``; ``size`` names the request's size in
        the error for ``latents`` of another shape.
      text: ``text(use_cfg)`` → the text embeddings in the denoiser's dtype.
      guidance_scale / guidance_scale_2: CFG scale of the first / second expert's steps
        (guidance is on when ``guidance_scale > 1``; ``guidance_scale_2`` None = the same).
      condition: ``condition()`` → the family's condition pytree (None: text only), run in
        phase ``condition_phase``; ``finalize(condition, latents)`` → the latents to decode.
      latents / seed: the start latents, else ``seed``'s draw (:func:`initial_noise`);
        ``sigmas``: explicit ones (Euler only, :func:`set_timesteps`).
      mesh / cfg_mode: where and how the CFG branches run.
      cache, cache_threshold, cfg_cache, cache_coefficients: step caching
        (:mod:`ditax.pipelines.cache.step_cache`).
      prepare_decode: ``prepare_decode()`` → the decode's compiled programs (timed as compile);
        ``decode(latents, prepared)`` → the output; no ``decode``: the output is the latents.
      start_step: the first ``start_step`` of the ``num_inference_steps`` steps are cut (the
        scheduler's ``from_step``; video-to-video's strength); ``source()`` → clean latents of
        ``latent_shape`` (run in phase ``condition_phase``) that the noise is added to at the
        first kept step; given ``latents`` are that noised start instead, as diffusers'.
    """

    programs: Programs
    experts: Sequence[Expert]
    inputs: Any
    scheduler: Any
    latent_shape: tuple[int, ...]
    text: Callable[[bool], Any]
    num_inference_steps: int
    guidance_scale: float
    guidance_scale_2: float | None = None
    boundary: float | None = None
    condition: Callable[[], Any] = lambda: None
    condition_phase: str = "condition"
    latents: Any = None
    seed: int = 0
    sigmas: Any = None
    mesh: Any = None
    cfg_mode: str = "batched"
    cache: str | None = None
    cache_threshold: float | None = None
    cfg_cache: bool = False
    cache_coefficients: Any = None
    finalize: Callable[[Any, Any], Any] | None = None
    prepare_decode: Callable[[], Any] | None = None
    decode: Callable[[Any, Any], Any] | None = None
    size: str = ""
    start_step: int = 0
    source: Callable[[], Any] | None = None

    @property
    def use_cfg(self) -> bool:
        """Whether the steps run classifier-free guidance (``guidance_scale > 1``)."""
        return self.guidance_scale > 1.0

    def low(self, t) -> bool:
        """Whether timestep ``t`` is below the two-expert boundary."""
        return self.boundary is not None and t < self.boundary

    def expert_at(self, t) -> Expert:
        """The expert that runs the step at timestep ``t``."""
        return self.experts[1] if self.low(t) and len(self.experts) > 1 else self.experts[0]

    def guidance_at(self, t) -> float:
        """The CFG scale of the step at timestep ``t``."""
        if self.low(t) and self.guidance_scale_2 is not None:
            return self.guidance_scale_2
        return self.guidance_scale

    def step_static(self, expert: Expert) -> tuple:
        """The static arguments of the step programs (:func:`~ditax.pipelines.denoise
        ._denoise_step`'s first five) for ``expert``."""
        return expert.graphdef, self.inputs, self.scheduler, self.cfg_mode, self.use_cfg

    def checked_latents(self):
        """The given ``latents`` as float32 ``latent_shape`` (:func:`check_latents`), or None."""
        if self.latents is None:
            return None
        return check_latents(self.latents, tuple(self.latent_shape), self.size)

    def noise(self, latents=None) -> jax.Array:
        """The start latents: ``latents`` (checked ones) as float32, else ``seed``'s draw."""
        if latents is None:
            return initial_noise(self.seed, tuple(self.latent_shape))
        return jnp.asarray(latents, jnp.float32)

    def schedule(self):
        """The scheduler's fresh state for this request (its first ``start_step`` cut)."""
        state = set_timesteps(self.scheduler, self.num_inference_steps,
                              tuple(self.latent_shape), self.sigmas)
        if self.start_step:
            state = self.scheduler.from_step(state, self.start_step)
        return state

    def run(self, progress: bool = True,
            on_step: Callable[[int], None] | None = None) -> Sampled:
        """This request alone through :func:`sample`."""
        return sample(self, progress=progress, on_step=on_step)


def sample(prepared: Prepared, *, progress: bool = True,
           on_step: Callable[[int], None] | None = None, dry: bool = False) -> Sampled:
    """Run one prepared request (:class:`Prepared`; its fields say what each part is) through
    the loop of the module docstring. ``progress``: a progress bar of the steps;
    ``on_step(steps_done)`` after each step has finished on the device (a server's progress;
    an exception it raises stops the loop). ``dry``: everything but the steps (a warm-up's:
    the programs compiled — or noted, :meth:`~ditax.pipelines.programs.Programs.deferring` —
    and the ops around the loop run at the request's shapes; the output is the noise's)."""
    p = prepared
    use_cfg = p.use_cfg
    check_cfg_batch(use_cfg, p.cfg_mode, p.mesh)
    check_cache_args(p.cache, p.cache_threshold, p.cfg_cache)
    latents = p.checked_latents()

    t0 = time.perf_counter()
    with phase(p.condition_phase):
        cond = jax.block_until_ready(replicate(p.condition(), p.mesh))
        src = (None if p.source is None or latents is not None
               else jax.block_until_ready(p.source()))
    t_image = time.perf_counter() - t0
    t0 = time.perf_counter()
    with phase("text"):
        emb = jax.block_until_ready(replicate(p.text(use_cfg), p.mesh))
    t1 = time.perf_counter()

    with phase("denoise"):   # compile nests inside (Programs)
        x, state = p.noise(latents), p.schedule()
        if src is not None:   # the source noised to the first kept step
            x = p.scheduler.add_noise(state, jnp.asarray(src, jnp.float32), x, 0)
        x, state = replicate(x, p.mesh), replicate(state, p.mesh)
        timesteps = np.asarray(state.timesteps)
        # ahead of time, before the first step: one step program per expert signature, decode
        p.programs.seconds = 0.0
        per_step = [p.expert_at(t) for t in timesteps]
        step_cache = plan_step_cache(
            p.cache, p.cache_threshold, p.cfg_cache, use_cfg=use_cfg, cfg_mode=p.cfg_mode,
            mesh=p.mesh, timesteps=timesteps, config=p.experts[0].config,
            num_train_timesteps=p.scheduler.num_train_timesteps, experts=per_step,
            coefficients=p.cache_coefficients)
        # attention.dense_steps: an expert's first steps run its dense twin (a graph of its
        # own, so one more program, not one a step)
        runs = schedule(per_step)
        if step_cache is not None and any(a is not b for a, b in zip(runs, per_step)):
            raise RequestError(f"cache={p.cache} with attention.dense_steps: the step cache's "
                               f"residuals do not carry over the dense/sparse switch; drop "
                               f"cache= or set attention.dense_steps=0")
        # each expert's own graph (equal for two plain experts: one program; an expert with
        # unmerged LoRAs has its own)
        if step_cache is None:
            steps = {id(e): p.programs.step(_denoise_step, p.step_static(e),
                                            (e.params, state, x, emb, jnp.float32(0), cond),
                                            carry=CARRY)
                     for e in runs}
        else:
            steps = {id(e): step_cache.compile(p.programs, e, p.inputs, p.scheduler, p.cfg_mode,
                                               use_cfg, state, x, emb, cond, mesh=p.mesh)
                     for e in runs}
        decoding = None if p.decode is None or p.prepare_decode is None else p.prepare_decode()
        t_compile = p.programs.seconds
        from tqdm.auto import tqdm

        for i in tqdm(range(0 if dry else len(timesteps)), disable=not progress, desc="denoise",
                      unit="step"):
            e = runs[i]
            x, state = steps[id(e)](e.params, state, x, emb, jnp.float32(p.guidance_at(
                timesteps[i])), cond)
            if progress or on_step is not None:   # a step counts once done on the device
                jax.block_until_ready(x)
            if on_step is not None:
                on_step(i + 1)
        x = jax.block_until_ready(x if p.finalize is None else p.finalize(cond, x))
        check_finite(x, "denoise", f"the latents after {len(timesteps)} steps", p.guidance_scale)
    stats = (uncached_stats(len(timesteps), use_cfg, extra_branches(p.inputs))
             if step_cache is None
             else step_cache.stats())
    t2 = time.perf_counter()
    timings = dict(text=t1 - t0, compile=t_compile, denoise=t2 - t1 - t_compile, image=t_image,
                   decode=0.0)
    if p.decode is None:
        return Sampled(np.asarray(x), stats, timings)
    with phase("decode"):
        out = p.decode(x, decoding)
        check_finite(out, "decode", "the decoded output", p.guidance_scale)
    timings["decode"] = time.perf_counter() - t2
    return Sampled(out, stats, timings)


def record(pipe, out: Sampled):
    """Keep a run's stats and timings on ``pipe`` (``pipe.last_stats``, ``pipe.timings`` with
    its ``load_time``), as every pipeline's call does; returns ``out.output``."""
    pipe.last_stats = out.stats
    pipe.timings = Timings(load=pipe.load_time, **out.timings)
    return out.output


__all__ = ["Expert", "Prepared", "Sampled", "Timings", "check_cfg_batch", "check_finite",
           "check_latents", "initial_noise", "record", "replicate", "sample", "set_timesteps"]
