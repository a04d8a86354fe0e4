"""Training sections of the config — optimiser, flow objective, data, checkpoints — and the
rules each of them owns (checked by :func:`ditax.config.validate` before anything traces)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional, get_args

from ditax.errors import ConfigError, check_choice

Schedule = Literal["constant", "cosine", "linear"]
TimestepSampler = Literal["uniform", "logit_normal"]
Weighting = Literal["none", "bell"]
FlowTarget = Literal["data", "dense_teacher"]
SCHEDULES = get_args(Schedule)
TIMESTEP_SAMPLERS = get_args(TimestepSampler)
WEIGHTINGS = get_args(Weighting)
FLOW_TARGETS = get_args(FlowTarget)


def _at_least(section: str, obj, names: tuple[str, ...], low: float) -> None:
    for k in names:
        if getattr(obj, k) < low:
            raise ConfigError(f"{section}.{k}={getattr(obj, k)} must be >= {low}")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with global-norm clipping and a warmup + decay learning-rate schedule."""

    learning_rate: float = 1e-4
    warmup_steps: int = 0
    schedule: Schedule = "constant"
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0       # <= 0: no clipping
    decay_steps: int = 0         # end of cosine/linear decay; 0 = the run's `steps`


def check_optim(o: OptimConfig) -> None:
    """Raise :class:`ConfigError` for optimiser settings that cannot train."""
    check_choice("optim.schedule", o.schedule, SCHEDULES)
    if o.learning_rate <= 0:
        raise ConfigError(f"optim.learning_rate={o.learning_rate} must be > 0")
    _at_least("optim", o, ("warmup_steps", "decay_steps", "weight_decay"), 0)
    for k in ("b1", "b2"):
        if not 0 <= getattr(o, k) < 1:
            raise ConfigError(f"optim.{k}={getattr(o, k)} must be in [0, 1)")
    if o.eps <= 0:
        raise ConfigError(f"optim.eps={o.eps} must be > 0")


@dataclass(frozen=True)
class FlowConfig:
    """Rectified-flow objective (Wan recipe). ``dynamic_shift`` and ``guidance`` are read by a
    model family that defines them (FLUX.1: :meth:`ditax.models.base.ModelFamily.check_flow`);
    the others refuse them."""

    timestep_sampler: TimestepSampler = "uniform"
    logit_mean: float = 0.0
    logit_std: float = 1.0
    shift: float = 1.0                 # sigma' = s*sigma / (1 + (s-1)*sigma)
    weighting: Weighting = "none"      # bell: well defined at batch 1
    dynamic_shift: bool = False        # the shift from the image size (FLUX.1-dev: s = e^mu)
    guidance: Optional[float] = None   # embedded guidance while training (FLUX.1-dev; None: 3.5)
    # what the prediction is trained towards: the data's velocity ``ε - x0`` (data), or the
    # frozen initial model's own prediction run with dense attention (dense_teacher: a sparse
    # model learns to reproduce its dense self, not to move towards the data)
    target: FlowTarget = "data"


def check_flow(f: FlowConfig) -> None:
    """Raise :class:`ConfigError` for a flow objective that cannot be sampled."""
    check_choice("flow.timestep_sampler", f.timestep_sampler, TIMESTEP_SAMPLERS)
    check_choice("flow.weighting", f.weighting, WEIGHTINGS)
    check_choice("flow.target", f.target, FLOW_TARGETS)
    if f.shift <= 0:
        raise ConfigError(f"flow.shift={f.shift} must be > 0")
    if f.logit_std <= 0:
        raise ConfigError(f"flow.logit_std={f.logit_std} must be > 0 (the spread of the "
                          f"logit-normal timesteps; 1.0 is usual)")


def check_flow_target(f: FlowConfig, sparsity: str, distill_method: str) -> None:
    """:class:`ConfigError` for ``flow.target=dense_teacher`` where it has nothing to match
    (no ``attention.sparsity``: the teacher would be the model itself) or where another
    objective brings its own teacher (a distillation)."""
    if f.target != "dense_teacher":
        return
    if sparsity == "none":
        raise ConfigError("flow.target=dense_teacher trains a sparse model to match its dense "
                          "self, but attention.sparsity=none (nothing to match); set "
                          "attention.sparsity (e.g. vsa with attention.topk) or flow.target=data")
    if distill_method != "none":
        raise ConfigError(f"flow.target=dense_teacher is a flow-matching objective; "
                          f"distill.method={distill_method} has its own teacher (a sparse "
                          f"student's scores already run dense); set flow.target=data")


@dataclass(frozen=True)
class DataConfig:
    source: str = "synthetic"          # synthetic | path to a dataset written by `ditax preprocess`
    num_frames: int = 5                # synthetic: pixel frames (latent F = (n-1)/4 + 1)
    height: int = 64                   # synthetic: pixel height
    width: int = 64
    text_len: int = 16                 # synthetic: text tokens
    shuffle: bool = True
    num_workers: int = 0
    text_dropout: float = 0.0          # share of samples trained on the empty prompt (for CFG)
    # a bucketed dataset (meta.json version 2): how often each bucket's batches are drawn,
    # "NAME:WEIGHT,..." (e.g. "832x480x81:2,480x832x81:1"; buckets left out are not drawn);
    # empty: in proportion to the buckets' sample counts
    bucket_weights: str = ""


_WEIGHTS_FIX = ("write NAME:WEIGHT pairs separated by commas, e.g. "
                "data.bucket_weights=832x480x81:2,480x832x81:1 (weights >= 0, at least one > 0; "
                "empty: by bucket size)")


def parse_bucket_weights(text: str) -> dict[str, float]:
    """``data.bucket_weights`` as ``{bucket name: weight}`` (empty: none given); one
    :class:`ConfigError` line naming the value and the fix for a malformed one (a pair
    without a weight, a weight that is not a finite number >= 0, a name twice, all zero)."""
    out: dict[str, float] = {}
    if not text.strip():
        return out

    def bad(why: str):
        return ConfigError(f"data.bucket_weights={text!r}: {why}; {_WEIGHTS_FIX}")

    for item in text.split(","):
        name, sep, w = item.strip().rpartition(":")
        name = name.strip()
        if not sep or not name:
            raise bad(f"{item.strip()!r} is not NAME:WEIGHT")
        try:
            weight = float(w)
        except ValueError:
            raise bad(f"the weight of {name} ({w.strip()!r}) is not a number") from None
        if not math.isfinite(weight) or weight < 0:
            raise bad(f"the weight of {name} is {w.strip()}, not a finite number >= 0")
        if name in out:
            raise bad(f"bucket {name} is named twice")
        out[name] = weight
    if not sum(out.values()) > 0:
        raise bad("the weights sum to 0, so no bucket would be drawn")
    return out


def check_data(d: DataConfig) -> None:
    """Raise :class:`ConfigError` for impossible sample sizes or bucket weights."""
    _at_least("data", d, ("num_frames", "height", "width", "text_len"), 1)
    _at_least("data", d, ("num_workers",), 0)
    if not 0 <= d.text_dropout < 1:
        raise ConfigError(f"data.text_dropout={d.text_dropout} must be in [0, 1) (the share of "
                          "samples trained on the empty prompt; 0.1 is usual)")
    parse_bucket_weights(d.bucket_weights)


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 100
    keep: int = 3
    async_save: bool = True


def check_checkpoint(c: CheckpointConfig) -> None:
    """Raise :class:`ConfigError` unless checkpoints are written and kept."""
    _at_least("checkpoint", c, ("every", "keep"), 1)


VaceTrainable = Literal["vace", "all"]
VACE_TRAINABLE = get_args(VaceTrainable)


@dataclass(frozen=True)
class TrainConfig:
    """Which weights a full (non-LoRA) run trains: ``vace_trainable`` for a VACE model
    (``model.vace_layers`` set): ``vace`` = its VACE branch only, the base frozen (no gradient,
    no optimiser state), as VACE was trained; ``all`` = every weight. Other models train
    every weight.

    ``first_frame_p``: the probability that a training sample is conditioned on its first
    frame (image-to-video): that latent frame stays clean, its tokens run at timestep 0 and
    are left out of the loss — the LTX-2 trainer's ``first_frame_conditioning_p`` (0.1 in its
    published configs). 0: text-to-video only. Only a family that declares it takes it
    (``ModelFamily.first_frame_training``; LTX-2)."""

    vace_trainable: VaceTrainable = "vace"
    first_frame_p: float = 0.0


def check_train(t: TrainConfig) -> None:
    """Raise :class:`ConfigError` for an unknown choice or a probability outside [0, 1]."""
    check_choice("train.vace_trainable", t.vace_trainable, VACE_TRAINABLE)
    if not 0.0 <= t.first_frame_p <= 1.0:
        raise ConfigError(f"train.first_frame_p={t.first_frame_p:g} is a probability; use a "
                          f"value in [0, 1] (e.g. 0.1, the LTX-2 trainer's)")


LORA_TARGETS = ("attn", "self_attn", "cross_attn", "ffn")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA fine-tuning: ``rank`` > 0 trains only low-rank adapters on the ``targets`` (a comma
    list of :data:`LORA_TARGETS`), scaled by ``alpha / rank``; the base weights stay frozen.
    ``rank`` 0: full training."""

    rank: int = 0
    alpha: float = 0.0           # 0: alpha = rank (scale 1)
    targets: str = "attn,ffn"


def lora_targets(c: LoraConfig) -> tuple[str, ...]:
    """``targets`` as a tuple of names."""
    return tuple(t.strip() for t in c.targets.split(",") if t.strip())


def check_lora(c: LoraConfig) -> None:
    """Raise :class:`ConfigError` for adapters that cannot be built."""
    _at_least("lora", c, ("rank", "alpha"), 0)
    if c.alpha and not c.rank:
        raise ConfigError(f"lora.alpha={c.alpha:g} scales LoRA adapters, but lora.rank=0 is a "
                          f"full fine-tune (no adapters); set lora.rank=R too, or drop "
                          f"lora.alpha")
    if c.rank and not lora_targets(c):
        raise ConfigError(f"lora.targets={c.targets!r} names no layers; use a comma list of "
                          f"{', '.join(LORA_TARGETS)}")
    for t in lora_targets(c):
        check_choice("lora.targets", t, LORA_TARGETS)


DistillMethod = Literal["none", "dmd2", "self_forcing"]
DISTILL_METHODS = get_args(DistillMethod)


@dataclass(frozen=True)
class DistillConfig:
    """Few-step distillation (:mod:`ditax.train.distill`). ``method=dmd2``: the run's model is
    the student, initialised from the teacher (``init_from``), trained with distribution
    matching against the frozen teacher (the real score, classifier-free guided at
    ``guidance``) and a critic (the fake score) that learns the student's samples with the
    flow-matching loss, ``critic_updates`` critic steps per student step.

    The student samples with Euler on ``steps`` flow sigmas: ``sigmas`` (before the shift;
    None: 1, (K-1)/K, ..., 1/K) shifted by ``shift`` (0: the family's training shift at the
    data's resolution, FLUX.1's resolution shift included). ``backward_simulation``: the
    student trains on inputs its own earlier steps made (else on noised data latents).
    The critic's noise levels are uniform in ``[t_min, t_max]`` before the training shift.
    ``critic_learning_rate`` 0: ``optim.learning_rate``.

    ``gan_weight`` > 0 adds DMD2's GAN term: a small head on the critic's block features
    (the mean token the blocks hand the output head) tells the student's noised samples from
    noised data latents; the student's loss gets ``gan_weight``·softplus(-D(student)), the
    critic's (features and head) ``gan_critic_weight``·(softplus(D(student)) +
    softplus(-D(data))).

    ``sample_every`` N > 0: every N steps the student's K-step samples of the batch's first
    prompts from fixed noise, as latent previews (the first three latent channels of the
    middle frame, each stretched to its range), go to TensorBoard (``samples/student``) and to
    ``{output_dir}/samples/student_{step}.png``.

    Two experts (Wan 2.2 A14B): one student per expert, as the published 4-step LoRAs are.
    ``expert=high`` distils the high-noise expert (``init_from=FOLDER``, its ``transformer``)
    on the student steps whose timestep is at or above ``boundary`` x 1000 and critic noise
    levels there; ``expert=low`` the low-noise one (``init_from=FOLDER/transformer_2``) below
    it, on noised data latents (``backward_simulation=false``: the steps before are the other
    expert's).

    ``method=self_forcing`` (issue 59): the same losses on a causal student
    (``model.causal_chunk``) that rolls out its own video chunk by chunk with its KV cache
    (:mod:`ditax.train.self_forcing`). ``rollout_chunks`` N > 0 (self_forcing only; 0 = off:
    the rollout is the data's length): the student rolls out N chunks, past the teacher's
    length, and the losses see a random window of the data's length from it (Self-Forcing++'s
    long-horizon training)."""

    method: DistillMethod = "none"
    steps: int = 4
    sigmas: Optional[tuple[float, ...]] = None
    shift: float = 0.0
    guidance: float = 5.0
    critic_updates: int = 5
    critic_learning_rate: float = 0.0
    t_min: float = 0.02
    t_max: float = 0.98
    backward_simulation: bool = True
    expert: Literal["all", "high", "low"] = "all"
    boundary: float = 0.875
    gan_weight: float = 0.0
    gan_critic_weight: float = 1.0
    sample_every: int = 0
    rollout_chunks: int = 0


def check_distill(d: DistillConfig) -> None:
    """Raise :class:`ConfigError` for a distillation that cannot run."""
    check_choice("distill.method", d.method, DISTILL_METHODS)
    _at_least("distill", d, ("steps", "critic_updates"), 1)
    _at_least("distill", d, ("sample_every", "rollout_chunks"), 0)
    if d.rollout_chunks and d.method != "self_forcing":
        raise ConfigError(f"distill.rollout_chunks={d.rollout_chunks} is a causal student's "
                          f"long rollout; it needs distill.method=self_forcing (method="
                          f"{d.method}): set distill.rollout_chunks=0")
    _at_least("distill", d, ("shift", "critic_learning_rate", "gan_weight",
                             "gan_critic_weight"), 0)
    if d.guidance < 1:
        raise ConfigError(f"distill.guidance={d.guidance:g} must be >= 1 (the teacher's "
                          f"classifier-free guidance scale; 1 = no guidance)")
    if not 0 <= d.t_min < d.t_max <= 1:
        raise ConfigError(f"distill.t_min={d.t_min:g}, distill.t_max={d.t_max:g}: need "
                          f"0 <= t_min < t_max <= 1 (the critic's noise levels)")
    check_choice("distill.expert", d.expert, ("all", "high", "low"))
    if not 0 < d.boundary < 1:
        raise ConfigError(f"distill.boundary={d.boundary:g} must be in (0, 1) (Wan 2.2: "
                          f"0.875, the folder's boundary_ratio)")
    if d.expert == "low" and d.backward_simulation:
        raise ConfigError("distill.expert=low trains the steps after the high-noise expert's, "
                          "which this run does not have; set distill.backward_simulation=false "
                          "(its inputs are noised data latents)")
    if d.sigmas is not None:
        s = [float(x) for x in d.sigmas]
        if len(s) != d.steps:
            raise ConfigError(f"distill.sigmas has {len(s)} values for distill.steps="
                              f"{d.steps}; give one per step or distill.sigmas=none")
        if not all(0 < x <= 1 for x in s) or any(a <= b for a, b in zip(s, s[1:])):
            raise ConfigError(f"distill.sigmas={list(s)} must decrease within (0, 1], e.g. "
                              f"1,0.75,0.5,0.25")


def distill_sigmas(d: DistillConfig) -> tuple[float, ...]:
    """The student's flow sigmas before the shift, one per step."""
    if d.sigmas is not None:
        return tuple(float(x) for x in d.sigmas)
    return tuple(1.0 - i / d.steps for i in range(d.steps))


__all__ = ["DistillConfig", "DISTILL_METHODS", "check_distill", "distill_sigmas", "TrainConfig", "check_train", "VACE_TRAINABLE", "LoraConfig", "LORA_TARGETS", "lora_targets", "check_lora", "OptimConfig", "FlowConfig", "DataConfig", "CheckpointConfig", "check_optim",
           "check_flow", "check_flow_target", "FLOW_TARGETS", "check_data", "check_checkpoint", "SCHEDULES", "TIMESTEP_SAMPLERS",
           "WEIGHTINGS", "parse_bucket_weights"]
