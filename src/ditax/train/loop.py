"""The training loop: mesh, data, state (fresh, ``init_from`` or resumed), steps, checkpoints.

``train(cfg)`` is what ``ditax train`` calls. Rerunning with the same ``output_dir`` resumes
from the newest usable checkpoint (params, optimiser, data position, RNG, step) and runs until
``steps``; what may change between the runs is :data:`RESUME_POLICY` (see
:mod:`ditax.train.resume`): a change of the model, LoRA, data, batch size or seed is refused
before anything is restored or written. A partly frozen run (LoRA, a VACE branch) checkpoints
only what trains and a reference to its frozen base, which a resume rebuilds from ``init_from``
(or the seed) after checking it is unchanged (:mod:`ditax.train.frozen_base`).
``metrics.jsonl`` and TensorBoard keep each step once.
A bucketed dataset (:mod:`ditax.train.bucket_data`) gives batches of several shapes: the
compiled step keeps one program a shape (the first step of each compiles or loads it from the
persistent cache, ``includes_compile`` in its row), FLOPs and tokens per sample follow each
batch's shape, each row names its ``bucket``, and the run ends with the loss per bucket. What
needs one shape (a student's sample settings and previews) takes the most drawn bucket's.
SIGTERM or SIGINT (Ctrl-C) finishes the current step, saves, and returns. A non-finite loss
stops the run before anything is saved, so the newest checkpoint stays the last good one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import jax

from ditax.config import Config, ConfigError, to_dict, validate
from ditax.io.remote.datasets import local_source
from ditax.models.base import model_family
from ditax.parallel.mesh import make_mesh
from ditax.train import frozen_base
from ditax.train.checkpoint import Checkpointer
from ditax.train.batches import BatchIterator
from ditax.train.metrics import MetricsWriter, peak_tflops
from ditax.train.resume import (ResumePolicy, check_output_dir, check_resume, open_run_folder,
                                read_saved_config, write_config)
from ditax.train.session import NonFiniteLoss, RunSession  # noqa: F401 (public here too)
from ditax.train.trainers import make_trainer
from ditax.train.step import Trainer

log = logging.getLogger(__name__)

#: What a rerun of a run may change (dotted keys; ``section.`` = all of it); the rest of the
#: config (model shapes and dtypes, LoRA, data, batch size, seed) must stay as it was.
RESUME_POLICY = ResumePolicy(
    free=("steps", "log_every", "checkpoint.", "compile_cache", "name", "output_dir",
          "distill.sample_every",
          "sample.", "mesh.", "attention.", "model.remat", "data.num_workers"),
    notice=("optim.", "flow.", "data.text_dropout", "model.dtype", "init_from",
            "distill.rollout_chunks"),
    fixed=("flow.target",))     # a full run's dense teacher is a state entry


@dataclass
class TrainResult:
    step: int                       # completed steps
    losses: list[float] = field(default_factory=list)   # losses of the steps run here
    buckets: list[str] = field(default_factory=list)    # their buckets (a bucketed dataset)
    state: dict | None = None       # final train state (global arrays)
    interrupted: bool = False       # stopped by SIGTERM / SIGINT (checkpoint saved)
    signal: int | None = None       # the signal that stopped it
    resumed_from: int | None = None


def _say(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


def say_buckets(buckets, say) -> None:
    """One line: the dataset's buckets, their sizes and how often each is drawn."""
    w = buckets.weights / buckets.weights.sum()
    parts = [f"{b.name} ({b.num_samples} samples, {p:.0%} of batches)" if p > 0
             else f"{b.name} ({b.num_samples} samples, not drawn: data.bucket_weights)"
             for b, p in zip(buckets.buckets, w)]
    say(f"bucketed dataset, each batch from one bucket: {', '.join(parts)}")


def bucket_summary(by_bucket: dict[str, list[float]], last: int = 10) -> str:
    """The loss of each bucket over this run's steps: the mean of its last ``last``."""
    parts = [f"{name} {sum(v[-last:]) / len(v[-last:]):.4f} ({len(v)} step"
             f"{'s' if len(v) > 1 else ''})"
             for name, v in by_bucket.items()]
    return f"loss per bucket (mean of each one's last {last} steps): {', '.join(parts)}"


def train(cfg: Config, *, mesh=None, trainer: Trainer | None = None, progress: bool = True,
          say=_say, on_step=None) -> TrainResult:
    """Run (or resume) training as configured; returns the completed step count and losses.

    ``mesh`` overrides the mesh built from ``cfg.mesh``. ``trainer``: a :class:`Trainer` to
    run with (its mesh and its compiled step), e.g. one kept from an earlier call; it must have
    been built for the same model / attention / optimiser / objective / seed as ``cfg``.
    ``on_step(step, row)`` is called after each step's metrics (hooks, tests).
    """
    validate(cfg, jax.device_count(), training=True)
    if trainer is not None:
        trainer.check_serves(cfg)
        if mesh is not None and mesh != trainer.mesh:
            raise ConfigError("train(mesh=..., trainer=...): the mesh differs from the "
                              "Trainer's; pass one of them")
        mesh = trainer.mesh
    mesh = mesh if mesh is not None else make_mesh(cfg.mesh)
    pid, nproc = jax.process_index(), jax.process_count()

    # before anything loads: a file, an unwritable or foreign folder, a URL it cannot reach
    check_output_dir(cfg.output_dir, urls=True)
    # a URL: this host's staging folder, synced, and the dataset's mirror (ditax.io.remote)
    run_dir, data_cfg = open_run_folder(cfg.output_dir, say), local_source(cfg, say)
    out = run_dir.local
    saved = read_saved_config(out)
    ckpt = Checkpointer(out / "checkpoints", cfg.checkpoint, say=say,
                        sync=run_dir.steps(cfg.checkpoint.keep))
    # the newest checkpoint's JSON item: a partly frozen run's reference to its base
    stored = frozen_base.stored_data(ckpt) if ckpt.steps() else None
    if ckpt.steps():            # a rerun must ask for the run the folder holds
        check_resume(out, saved, to_dict(cfg), frozen_base.resume_policy(RESUME_POLICY, stored),
                     say=say)
    data = BatchIterator(data_cfg, pid, nproc)  # checks the dataset before anything compiles
    family = model_family(cfg.model, cfg.attention)
    # a missing or changed frozen base: refused before anything is restored
    base_files = frozen_base.check_base(stored, cfg, family, ckpt.where, say=say)
    if cfg.init_from:
        init_folder = family.weights_folder(cfg.init_from)
    trainer = trainer if trainer is not None else make_trainer(data_cfg, mesh)
    if hasattr(trainer, "bind_data"):       # distillation: the empty prompt's embedding
        trainer.bind_data(data)

    # a partly frozen run's checkpoints leave out its frozen weights: rebuilt here from the
    # base (init_from or the seed) as at step 0, their checksum checked against the stored one
    rebuilt = getattr(trainer, "rebuilt", ())
    if rebuilt and frozen_base.legacy(stored):
        rebuilt = ()
        say(f"checkpoints in {ckpt.where} hold the frozen base (written before ditax left it "
            f"out): restoring it from them, and this run's checkpoints keep holding it")
    restored = ckpt.restore_latest(frozen_base.without(trainer.abstract_state(), rebuilt))
    if restored is None or rebuilt:
        params = None
        if cfg.init_from:
            params = family.load_params(init_folder, mesh)
        fresh = trainer.init(params)
        del params                  # a split copies the base into its frozen tree
    if restored is not None:
        start, state, data_state = restored
        data.set_state(data_state["iterator"])
        state = {**state, **{k: fresh[k] for k in rebuilt}}
        base = (f"; the frozen base rebuilt from {init_folder if cfg.init_from else 'the seed'}"
                if rebuilt else "")
        say(f"resuming from checkpoint step {start} in {ckpt.where}{base}")
    else:
        start, state = 0, fresh
        if cfg.init_from:
            say(f"initialised weights from {init_folder}")
    base_ref = None
    if rebuilt:
        checksum = frozen_base.tree_checksum({k: state[k] for k in rebuilt}, mesh)
        if restored is not None:
            frozen_base.check_rebuilt(data_state["base"], checksum, start, ckpt.where)
        if cfg.init_from and base_files is None:
            base_files = frozen_base.fingerprint(init_folder)
        base_ref = frozen_base.reference(cfg, cfg.init_from and init_folder, base_files,
                                         checksum)
    if pid == 0:                # the config the run goes on with (the next resume's reference)
        out.mkdir(parents=True, exist_ok=True)
        write_config(out, to_dict(cfg))

    result = TrainResult(step=start, resumed_from=start if restored else None)
    if start >= cfg.steps:
        say(f"nothing to do: checkpoint step {start} >= steps={cfg.steps}")
        ckpt.close()
        result.state = state
        return result

    costs: dict = {}        # latent shape -> (model FLOPs of a step, tokens of a sample)

    def cost(shape):
        if shape not in costs:
            # a sparse student's distillation: its calls and the dense scores' at their costs
            own = getattr(trainer, "sample_flops", lambda *_: None)(shape, data.text_shape[0])
            costs[shape] = (own * cfg.batch_size if own is not None else
                            family.flops_per_sample(shape, data.text_shape[0]) * cfg.batch_size
                            * getattr(trainer, "flops_factor", 1.0),
                            family.tokens_per_sample(shape))
        return costs[shape]

    peak = peak_tflops()
    if data.buckets is not None:
        say_buckets(data.buckets, say)
    writer = MetricsWriter(out, enabled=pid == 0, resume_step=start)
    if writer.dropped:
        say(f"metrics: dropped {writer.dropped} rows after step {start} from "
            f"{writer.path} (written after the last checkpoint; those steps run again)")

    data_tag = {"source": cfg.data.source, "batch_size": cfg.batch_size}
    if base_ref is not None:
        data_tag["base"] = base_ref
    step = start
    by_bucket: dict[str, list[float]] = {}
    # previews show the most drawn bucket's shape (one preview program, comparable images):
    # its latest batch, or the step's own until that bucket came
    preview_shape, preview_batch = tuple(data.latent_shape), None
    with RunSession(ckpt, writer, total=cfg.steps, start=start, desc="train",
                    every=cfg.checkpoint.every, progress=progress and pid == 0,
                    say=say) as run:
        while step < cfg.steps:
            t0 = time.perf_counter()
            local = next(data)
            shape = tuple(local["latents"].shape[1:])     # the batch's bucket's
            first_of_shape = shape not in costs         # its step compiles (or loads) now
            flops, tokens_per_sample = cost(shape)
            batch = trainer.put_batch(local)
            if shape == preview_shape:
                preview_batch = batch
            state, m = trainer.step(state, batch)
            loss = float(m["loss"])            # syncs: the step time below is real
            dt = time.perf_counter() - t0
            step += 1
            run.check_loss(loss, step, "Lower optim.learning_rate, check the data for NaN/inf, "
                           "or use bfloat16/float32 consistently")
            result.losses.append(loss)
            row = {"step": step}
            if data.bucket is not None:
                row["bucket"] = data.bucket
                result.buckets.append(data.bucket)
                by_bucket.setdefault(data.bucket, []).append(loss)
            row.update({"loss": loss, "grad_norm": float(m["grad_norm"]),
                        "lr": float(m["lr"]), "step_time": dt,
                        "samples_per_s": cfg.batch_size / dt,
                        "tokens_per_s": cfg.batch_size * tokens_per_sample / dt,
                        "tflops_per_device": flops / dt / mesh.devices.size / 1e12,
                        "mfu": (flops / dt / mesh.devices.size / (peak * 1e12)) if peak
                        else None})
            row.update({k: float(v) for k, v in m.items() if k not in row})   # e.g. distill
            if first_of_shape:
                row["includes_compile"] = True
            if step % cfg.log_every == 0 or step == cfg.steps:
                writer.write(row)
            every = cfg.distill.sample_every if hasattr(trainer, "preview") else 0
            if every and (step % every == 0 or step == cfg.steps):  # every process computes
                writer.image("samples/student", trainer.preview(
                    state, batch if preview_batch is None else preview_batch), step)
            if on_step is not None:
                on_step(step, row)
            run.tick(loss=f"{loss:.4f}", s_per_step=f"{dt:.2f}",
                     **({"bucket": data.bucket} if data.bucket is not None else {}))
            if run.end_step(step, frozen_base.without(state, rebuilt),
                            {"iterator": data.get_state(), **data_tag}):
                break
    result.interrupted, result.signal = run.interrupted, run.signal if run.interrupted else None
    if by_bucket:
        say(bucket_summary(by_bucket))
    if trainer.adapters is not None and (step == cfg.steps or result.interrupted):
        # a few-step student's; a bucketed dataset: at its most drawn bucket's shape
        sample = (trainer.sample_settings(data.latent_shape)
                  if hasattr(trainer, "sample_settings") else None)
        files = trainer.adapters.save(out, state["params"], sample=sample)
        if files:
            say(f"saved the LoRA as {run_dir.shown(files[0])} (diffusers) and "
                f"{run_dir.shown(files[1])} (ComfyUI)")
    elif hasattr(trainer, "sample_settings") and pid == 0:   # a full-weight student: its
        from ditax.lora.export import write_sample          # settings, for ditax export

        write_sample(out, trainer.sample_settings(data.latent_shape))     # whole, or raises
    run_dir.close()         # a URL run: its last files uploaded
    result.step = step
    result.state = state
    return result
