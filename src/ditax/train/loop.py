"""The training loop: mesh, data, state (fresh, ``init_from`` or resumed), steps, checkpoints.

``train(cfg)`` is what ``ditax train`` calls. Rerunning with the same ``output_dir`` resumes
from the newest usable checkpoint (params, optimiser, data position, RNG, step) and runs until
``steps``. SIGTERM finishes the current step, saves, and returns. A non-finite loss stops
the run before anything is saved, so the newest checkpoint stays the last good one.
"""

from __future__ import annotations

import logging
import pathlib
import time
from dataclasses import dataclass, field

import jax

from ditax.config import Config, ConfigError, to_dict, validate
from ditax.models.base import model_family
from ditax.parallel.mesh import make_mesh
from ditax.train.checkpoint import Checkpointer
from ditax.train.data import BatchIterator
from ditax.train.metrics import MetricsWriter, peak_tflops
from ditax.train.session import NonFiniteLoss, RunSession  # noqa: F401 (public here too)
from ditax.train.step import Trainer

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    step: int                       # completed steps
    losses: list[float] = field(default_factory=list)   # losses of the steps run here
    state: dict | None = None       # final train state (global arrays)
    interrupted: bool = False       # stopped by SIGTERM (checkpoint saved)
    resumed_from: int | None = None


def _say(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


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
    out = pathlib.Path(cfg.output_dir)
    pid, nproc = jax.process_index(), jax.process_count()

    data = BatchIterator(cfg, pid, nproc)       # checks the dataset before anything compiles
    family = model_family(cfg.model, cfg.attention)
    if cfg.init_from:
        init_folder = family.weights_folder(cfg.init_from)
    trainer = trainer if trainer is not None else Trainer(cfg, mesh)
    ckpt = Checkpointer(out / "checkpoints", cfg.checkpoint, say=say)

    restored = ckpt.restore_latest(trainer.abstract_state())
    if restored is not None:
        start, state, data_state = restored
        data.set_state(data_state["iterator"])
        say(f"resuming from checkpoint step {start} in {ckpt.dir}")
    else:
        start = 0
        params = None
        if cfg.init_from:
            params = family.load_params(init_folder, mesh)
            say(f"initialised weights from {init_folder}")
        state = trainer.init(params)
        if pid == 0:
            out.mkdir(parents=True, exist_ok=True)
            import yaml

            (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))

    result = TrainResult(step=start, resumed_from=start if restored else None)
    if start >= cfg.steps:
        say(f"nothing to do: checkpoint step {start} >= steps={cfg.steps}")
        ckpt.close()
        result.state = state
        return result

    flops = family.flops_per_sample(data.latent_shape, data.text_shape[0]) * cfg.batch_size
    peak = peak_tflops()
    tokens_per_sample = family.tokens_per_sample(data.latent_shape)
    writer = MetricsWriter(out, enabled=pid == 0)

    data_tag = {"source": cfg.data.source, "batch_size": cfg.batch_size}
    step = start
    with RunSession(ckpt, writer, total=cfg.steps, start=start, desc="train",
                    every=cfg.checkpoint.every, progress=progress and pid == 0,
                    say=say) as run:
        while step < cfg.steps:
            t0 = time.perf_counter()
            batch = trainer.put_batch(next(data))
            state, m = trainer.step(state, batch)
            loss = float(m["loss"])            # syncs: the step time below is real
            dt = time.perf_counter() - t0
            step += 1
            run.check_loss(loss, step, "Lower optim.learning_rate, check the data for NaN/inf, "
                           "or use bfloat16/float32 consistently")
            result.losses.append(loss)
            row = {"step": step, "loss": loss, "grad_norm": float(m["grad_norm"]),
                   "lr": float(m["lr"]), "step_time": dt,
                   "samples_per_s": cfg.batch_size / dt,
                   "tokens_per_s": cfg.batch_size * tokens_per_sample / dt,
                   "tflops_per_device": flops / dt / mesh.devices.size / 1e12,
                   "mfu": (flops / dt / mesh.devices.size / (peak * 1e12)) if peak else None}
            if step == start + 1:
                row["includes_compile"] = True
            if step % cfg.log_every == 0 or step == cfg.steps:
                writer.write(row)
            if on_step is not None:
                on_step(step, row)
            run.tick(loss=f"{loss:.4f}", s_per_step=f"{dt:.2f}")
            if run.end_step(step, state, {"iterator": data.get_state(), **data_tag}):
                break
    result.interrupted = run.interrupted
    if trainer.adapters is not None and (step == cfg.steps or result.interrupted):
        files = trainer.adapters.save(out, state["params"])
        if files:
            say(f"saved the LoRA as {files[0]} (diffusers) and {files[1]} (ComfyUI)")
    result.step = step
    result.state = state
    return result
