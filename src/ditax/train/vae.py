"""The VAE trainer every family's ``ditax train-vae`` runs on: clips (or still images) in
memory, the jitted train step on a data mesh, the run loop with checkpoints, resume, metrics
and the held-out PSNR. A family supplies only its VAE (:class:`VAETrainer`'s hooks: build,
load, posterior init, autoencode, reconstruct, latent statistics, folder): the Wan VAE
(:mod:`ditax.train.wan.vae`) and the Flux VAE (:mod:`ditax.train.flux.vae`).

Objective: reconstruction (L1 + L2 on pixels in [-1, 1]) plus a small KL term towards
N(0, 1), on a posterior draw ``z = mean + exp(logvar / 2) * eps`` (:func:`reconstruction_losses`).

Training samples are random windows (``data.crop_frames`` frames, ``data.crop`` pixels square)
of clips held in memory as uint8 (a still image is a clip of one frame;
:mod:`ditax.train.vae_clips`); sample ``i`` of step
``s`` is a function of ``(seed, s)`` only, so a resumed run draws the same batches and ends
bit-identical to an uninterrupted one. The train state is ``{"params", "opt", "step", "key"}``
like the transformer's and goes through the same orbax
:class:`~ditax.train.checkpoint.Checkpointer` (keep-N, async, damaged checkpoints skipped).
Held-out clips (the last ``data.eval_clips``) are reconstructed whole for the PSNR.

At the end the run writes ``{output_dir}/vae/`` (the family's diffusers layout, with latent
statistics measured on the training clips' posterior means), ``metrics.jsonl``, ``loss.png``
and ``summary.json``.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import pathlib
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ditax.errors import ConfigError
from ditax.train.checkpoint import Checkpointer
from ditax.train.resume import (ResumePolicy, check_output_dir, check_resume, read_saved_config,
                                write_config)
from ditax.train.session import RunSession
from ditax.train.step import make_optimizer
from ditax.train.vae_clips import ClipBank


def psnr(a, b) -> float:
    """PSNR in dB of images / videos in [-1, 1] measured on the [0, 1] scale."""
    mse = float(np.mean(((np.asarray(a, np.float64) - np.asarray(b, np.float64)) / 2.0) ** 2))
    return float("inf") if mse == 0 else 10.0 * math.log10(1.0 / mse)


def reconstruction_losses(recon, mean, logvar, x, loss_cfg) -> tuple[jax.Array, dict]:
    """Loss and its parts of a reconstruction ``recon`` of ``x`` (any layout, the same;
    channels-last ``[..., H, W, C]`` for the colour term) from the posterior ``(mean,
    logvar)``."""
    err = recon.astype(jnp.float32) - x
    l1 = jnp.mean(jnp.abs(err))
    mse = jnp.mean(err ** 2)
    mean, logvar = mean.astype(jnp.float32), logvar.astype(jnp.float32)
    kl = 0.5 * jnp.mean(mean ** 2 + jnp.exp(logvar) - 1.0 - logvar)
    loss = loss_cfg.l1 * l1 + loss_cfg.l2 * mse + loss_cfg.kl * kl
    parts = {"l1": l1, "mse": mse, "kl": kl}
    if loss_cfg.colour:          # channels-last batches: [..., H, W, C]
        k = loss_cfg.colour_block
        *lead, h, w, c = err.shape
        blocks = err.reshape(*lead, h // k, k, w // k, k, c).mean(axis=(-4, -2))
        parts["colour"] = jnp.mean(jnp.abs(blocks))
        loss = loss + loss_cfg.colour * parts["colour"]
    return loss, parts


@dataclass
class VAETrainResult:
    step: int
    losses: list[float] = field(default_factory=list)
    eval_psnr: float | None = None
    folder: pathlib.Path | None = None
    resumed_from: int | None = None
    interrupted: bool = False
    signal: int | None = None       # the signal that stopped it (SIGTERM / SIGINT)
    state: dict | None = None


def check_devices(cfg, count: int) -> None:
    """``batch_size`` clips split evenly over ``count`` devices; else a :class:`ConfigError`
    naming the device counts that would (checked before any clip is read)."""
    if count < 1 or cfg.batch_size % count:
        fits = [n for n in range(1, cfg.batch_size + 1) if cfg.batch_size % n == 0]
        raise ConfigError(f"batch_size={cfg.batch_size} does not split over {count} device(s); "
                          f"use --devices {' / '.join(map(str, fits))}, or a batch_size that "
                          f"is a multiple of {count}")


class VAETrainer(abc.ABC):
    """A family's VAE, its optimiser, and the jitted train step (state donated) on a 1-D data
    mesh: parameters replicated, the batch split over ``devices`` devices. Subclasses give the
    VAE (the hooks below); everything else is shared.

    The step takes the learning rate as an argument (the schedule's value at the step, from a
    small program of its own), so its program is the same for every schedule: a trainer built
    with ``programs_from=`` an earlier one whose :meth:`program_key` it shares runs that one's
    compiled step, encode and decode (a recipe's second stage on its first stage's VAE at
    another learning rate compiles nothing of them again)."""

    def __init__(self, cfg, devices=None, programs_from: "VAETrainer | None" = None):
        self.cfg = cfg
        devs = list(devices if devices is not None else jax.devices()[:1])
        check_devices(cfg, len(devs))
        self.mesh = Mesh(np.array(devs), ("data",))
        # random weights only when they are used (an init_from run loads its own: a random
        # init is a compile per parameter shape)
        vae = self.load_init(cfg) if cfg.init_from else self.build(cfg)
        # the posterior starts narrow (log-variance bias ``loss.init_logvar``): with the usual
        # zero bias, std-1 noise on the latents drowns the signal and the tiny KL weight
        # leaves the encoder to shrink it weight by weight for thousands of steps
        if not cfg.init_from:
            self.init_posterior(vae, cfg.loss.init_logvar)
        self.graphdef, params, self.rest = nnx.split(vae, nnx.Param, ...)
        self._init_params = params
        self.tx, self.schedule = make_optimizer(cfg.optim, cfg.steps)
        self.replicated = NamedSharding(self.mesh, P())
        self.batch_sharding = NamedSharding(self.mesh, P("data"))
        # the learning rate of step ``state["step"]``, handed to the step as an argument
        self._rate = jax.jit(lambda step: jnp.asarray(self.schedule(step), jnp.float32))
        self._step = jax.jit(self._train_step, donate_argnums=0)
        # the inference paths as whole programs (op by op, each op compiles on its own)
        self._encode = jax.jit(lambda params, x: self.encode(self.module(params), x))
        self._decode = jax.jit(lambda params, z: self.decode(self.module(params), z))
        if programs_from is not None:
            self.share_programs(programs_from)

    #: the family's VAE module class, built as ``vae_class(cfg.vae, rngs=...)``
    vae_class: type
    #: the ``_class_name`` of the written folder's diffusers ``config.json``
    diffusers_class: str

    # --- the family's hooks
    def build(self, cfg) -> nnx.Module:
        """A random VAE of ``cfg.vae`` (seed ``cfg.seed``), in one compiled init (an eager one
        compiles ~100 small programs, one per shape)."""
        return init_replicated(lambda rngs: self.vae_class(cfg.vae, rngs=rngs), cfg.seed,
                               self.mesh)

    @abc.abstractmethod
    def load_init(self, cfg) -> nnx.Module:
        """The VAE of the folder ``cfg.init_from`` (its architecture must be ``cfg.vae``'s)."""

    @abc.abstractmethod
    def init_posterior(self, vae, logvar: float) -> None:
        """Set the bias of the layer that outputs the posterior log-variance to ``logvar``."""

    @abc.abstractmethod
    def autoencode(self, vae, x, key) -> tuple:
        """Training forward of a batch ``x`` ``[B, F, H, W, 3]`` in [-1, 1] → (reconstruction,
        mean, log-variance, target like the reconstruction)."""

    @abc.abstractmethod
    def to_input(self, clips_u8: np.ndarray) -> np.ndarray:
        """uint8 clips ``[N, F, H, W, 3]`` → float32 in [-1, 1] in the VAE's public layout."""

    def encode(self, vae, x) -> np.ndarray:
        """Posterior means of ``x`` (:meth:`to_input` layout), channels on axis 1."""
        return vae.encode(x)

    @abc.abstractmethod
    def decode(self, vae, z) -> np.ndarray:
        """Images / videos in [-1, 1] of latents ``z`` (as :meth:`encode` gives them)."""

    @abc.abstractmethod
    def write_folder(self, folder, params, mean, std) -> pathlib.Path:
        """The trained VAE as the family's diffusers folder with the latent statistics
        (per-channel ``mean``, ``std`` of the posterior means)."""

    # --- shared
    def module(self, params):
        return nnx.merge(self.graphdef, params, self.rest)

    def save_folder(self, folder, params, vae_cfg, weight_table, dtype) -> pathlib.Path:
        """``params`` as a diffusers VAE folder of config ``vae_cfg`` (the measured latent
        statistics in it), the weights named by the family's ``weight_table``."""
        from ditax.io.export import save_folder

        save_folder(folder, "diffusion_pytorch_model.safetensors",
                    weight_table(self.module(params)), nnx.to_pure_dict(params),
                    diffusers_config(vae_cfg, self.diffusers_class), dtype=dtype)
        return pathlib.Path(folder)

    def program_key(self) -> dict:
        """What the compiled step, encode and decode compute besides their arguments: the
        family's hooks (``autoencode``, ``encode``, ``decode``: functions of their arguments),
        the VAE's graph (its config included), its non-parameter variables (baked into the
        programs: only trainers without any share), the loss, the optimiser less its schedule,
        the devices."""
        o = self.cfg.optim
        rest = jax.tree.leaves(self.rest)
        return {"family": type(self), "VAE graph": self.graphdef,
                "non-parameter variables": tuple(map(id, rest)) if rest else (),
                "loss": self.cfg.loss,
                "optimiser": (o.b1, o.b2, o.eps, o.weight_decay, o.grad_clip),
                "devices": tuple(self.mesh.devices.flat)}

    def share_programs(self, other: "VAETrainer") -> None:
        """Run ``other``'s jitted step, encode and decode (each compiled once for both);
        :class:`ValueError` naming what differs where they would compute something else."""
        mine, theirs = self.program_key(), other.program_key()
        diff = [k for k in mine if mine[k] != theirs[k]]
        if diff:
            raise ValueError(f"programs_from: that trainer's programs differ in "
                             f"{', '.join(diff)}; build this trainer without programs_from")
        self._step, self._encode, self._decode = other._step, other._encode, other._decode

    def init(self) -> dict:
        # a copy: the step donates the state, and a reused trainer initialises again
        params = jax.tree.map(lambda a: jnp.array(a, copy=True), self._init_params)
        state = {"params": params, "opt": self.tx.init(params), "step": jnp.int32(0),
                 "key": jax.random.key_data(jax.random.key(self.cfg.seed))}
        return jax.device_put(state, self.replicated)

    def abstract_state(self) -> dict:
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                           sharding=self.replicated),
                            jax.eval_shape(self.init))

    def _train_step(self, state, x, lr):
        """One update at learning rate ``lr`` (float32 ``[]``: the schedule's value at
        ``state["step"]``, which is also the optimiser's count)."""
        key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), state["step"])

        def loss_fn(params):
            recon, mean, logvar, target = self.autoencode(self.module(params), x, key)
            return reconstruction_losses(recon, mean, logvar, target, self.cfg.loss)

        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        tx, _ = make_optimizer(self.cfg.optim, self.cfg.steps, rate=lambda count: lr)
        updates, opt = tx.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, **parts, "grad_norm": optax.global_norm(grads), "lr": lr}
        return {"params": params, "opt": opt, "step": state["step"] + 1,
                "key": state["key"]}, metrics

    def step(self, state, batch: np.ndarray):
        lr = self._rate(state["step"])
        return self._step(state, jax.device_put(batch, self.batch_sharding), lr)

    def reconstruct(self, params, x: np.ndarray, batch: int = 4) -> np.ndarray:
        """Inference-path reconstruction (posterior mean) of ``x`` (:meth:`to_input` layout)."""
        out = [np.asarray(self._decode(params, self._encode(params, jnp.asarray(x[i:i + batch]))))
               for i in range(0, len(x), batch)]
        return np.concatenate(out)

    def latent_stats(self, params, clips_u8: np.ndarray, batch: int = 4, max_clips: int = 128):
        """Per-channel mean and std of the posterior means of the first ``max_clips`` clips."""
        clips_u8 = clips_u8[:max_clips]
        z = np.concatenate([np.asarray(self._encode(params, jnp.asarray(
            self.to_input(clips_u8[i:i + batch]))), np.float64)
            for i in range(0, len(clips_u8), batch)])
        axes = (0,) + tuple(range(2, z.ndim))
        return z.mean(axis=axes), z.std(axis=axes)


def diffusers_config(c, class_name: str) -> dict:
    """The diffusers ``config.json`` (``_class_name`` ``class_name``) of VAE config ``c``."""
    d = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(c).items()}
    return {"_class_name": class_name, **d}


def init_replicated(build, seed: int, mesh=None) -> nnx.Module:
    """``build(rngs)`` randomly initialised from ``seed`` in one compiled program, parameters
    replicated over ``mesh`` (default: the first device) — an eager init compiles once per
    parameter shape, which for a small VAE or text tower is most of its cost on CPU."""
    from ditax.models.common.loaded import init_module

    mesh = mesh or Mesh(np.array(jax.devices()[:1]), ("data",))
    rep = NamedSharding(mesh, P())
    return init_module(lambda _mesh, rngs: build(rngs), mesh, seed,
                       lambda state: jax.tree.map(lambda _: rep, state))


def _say(msg: str) -> None:
    print(msg, flush=True)


#: What a rerun of a VAE run may change (:mod:`ditax.train.resume`); the architecture, the
#: clips, the crops, the batch size and the seed must stay as they were.
VAE_RESUME_POLICY = ResumePolicy(
    free=("steps", "log_every", "eval_every", "checkpoint.", "output_dir"),
    notice=("optim.", "loss.", "init_from"))


def train_vae(cfg, trainer_class: type[VAETrainer], *, devices=None, progress: bool = True,
              say=_say, bank: ClipBank | None = None,
              trainer: VAETrainer | None = None) -> VAETrainResult:
    """Run (or resume, with the same ``output_dir``) VAE training; write the folder at the end.

    ``trainer``: a ``trainer_class`` (and its compiled step) to reuse, built for a config
    that differs from ``cfg`` at most in ``steps``, ``output_dir``, ``log_every``,
    ``eval_every`` and ``checkpoint``; set ``optim.decay_steps`` when ``steps`` differs."""
    from ditax.config.loader import to_dict
    from ditax.train.metrics import MetricsWriter

    out = pathlib.Path(cfg.output_dir)
    check_output_dir(cfg.output_dir)
    ckpt = Checkpointer(out / "checkpoints", cfg.checkpoint, say=say)
    if ckpt.steps():
        check_resume(out, read_saved_config(out), to_dict(cfg), VAE_RESUME_POLICY,
                     say=lambda m: say(f"train-vae: {m}"))
    bank = bank or ClipBank(cfg.data, say=say)
    if trainer is None:
        trainer = trainer_class(cfg, devices)
    else:
        same = ("vae", "data", "loss", "optim", "batch_size", "seed")
        diff = [k for k in same if getattr(trainer.cfg, k) != getattr(cfg, k)]
        if diff or (cfg.steps != trainer.cfg.steps and not cfg.optim.decay_steps):
            raise ValueError(f"train_vae(trainer=...): the trainer was built for another "
                             f"config ({diff or ['steps, with optim.decay_steps unset']}); "
                             "build a new trainer")
    restored = ckpt.restore_latest(trainer.abstract_state())
    if restored is not None:
        start, state, _ = restored
        say(f"train-vae: resuming from checkpoint step {start} in {ckpt.dir}")
    else:
        start, state = 0, trainer.init()
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, to_dict(cfg))
    result = VAETrainResult(step=start, resumed_from=start if restored else None)
    eval_x = trainer.to_input(bank.eval)        # held-out clips (evals and the end)
    step = start
    writer = MetricsWriter(out, enabled=True, resume_step=start)
    if writer.dropped:
        say(f"train-vae: metrics: dropped {writer.dropped} rows after step {start} from "
            f"{writer.path} (written after the last checkpoint; those steps run again)")
    with RunSession(ckpt, writer, total=cfg.steps, start=start,
                    desc="train-vae", every=cfg.checkpoint.every, progress=progress, say=say,
                    prefix="train-vae: ") as run:
        while step < cfg.steps:
            t0 = time.perf_counter()
            state, m = trainer.step(state, bank.batch(cfg.seed, step, cfg.batch_size))
            loss = float(m["loss"])
            dt = time.perf_counter() - t0
            step += 1
            run.check_loss(loss, step, "Lower optim.learning_rate or loss.kl")
            result.losses.append(loss)
            row = {"step": step, "loss": loss, **{k: float(m[k]) for k in
                                                  ("l1", "mse", "kl", "colour", "grad_norm",
                                                   "lr") if k in m},
                   "psnr_train": 10 * math.log10(4.0 / max(float(m["mse"]), 1e-12)),
                   "step_time": dt}
            if step == start + 1:
                row["includes_compile"] = True
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                row["psnr_eval"] = psnr(trainer.reconstruct(state["params"], eval_x), eval_x)
                say(f"train-vae: step {step}: held-out PSNR {row['psnr_eval']:.2f} dB")
            if step % cfg.log_every == 0 or step == cfg.steps or "psnr_eval" in row:
                run.writer.write(row)
            run.tick(loss=f"{loss:.4f}", psnr=f"{row['psnr_train']:.1f}")
            if run.end_step(step, state, {"step": step}):
                break
    result.interrupted = run.interrupted
    result.signal = run.signal if run.interrupted else None
    result.step, result.state = step, state
    if step >= cfg.steps and not result.interrupted:
        result.eval_psnr = psnr(trainer.reconstruct(state["params"], eval_x), eval_x)
        mean, std = trainer.latent_stats(state["params"], bank.train)
        result.folder = trainer.write_folder(out / "vae", state["params"], mean, std)
        summary = {"step": step, "eval_psnr": result.eval_psnr, "eval_clips": len(bank.eval),
                   "latents_mean": mean.tolist(), "latents_std": std.tolist()}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        from ditax.train.plots import loss_curve

        loss_curve(out / "metrics.jsonl", out / "loss.png", title="VAE training",
                   keys=("loss", "l1", "mse"), extra="psnr_eval")
        say(f"train-vae: held-out PSNR {result.eval_psnr:.2f} dB on {len(bank.eval)} clips; "
            f"wrote {result.folder} and {out / 'loss.png'}")
    return result


__all__ = ["VAETrainer", "VAETrainResult", "VAE_RESUME_POLICY", "check_devices",
           "diffusers_config", "init_replicated", "psnr", "reconstruction_losses", "train_vae"]
