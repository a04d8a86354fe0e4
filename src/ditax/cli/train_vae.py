"""``ditax train-vae [CONFIG.yaml] [key=value ...]``: train a model family's VAE (``--family``:
Wan's ``AutoencoderKLWan`` by default, Flux's ``AutoencoderKL``) on a folder of clips or images.

The trainer is the model family's (``--family``, default Wan: its
:meth:`~ditax.models.base.ModelFamily.trainers` ``"vae"`` entry: Wan's
:class:`ditax.train.wan.trainers.WanVAETraining`, Flux's :mod:`ditax.train.flux.trainers`; both
run the shared :mod:`ditax.train.vae`). Keys (``ditax config --vae --family F`` lists them):
``vae.*`` (the family's diffusers VAE config: Wan's ``AutoencoderKLWan`` ``base_dim``,
``z_dim``, ``dim_mult`` …; Flux's ``AutoencoderKL`` ``block_out_channels``,
``latent_channels`` …), ``data.source`` (folder of videos or images), ``data.num_frames /
height / width`` (what is read per clip), ``data.crop_frames`` / ``data.crop`` (training
windows), ``data.eval_clips`` (held out for the PSNR), ``loss.l1 / l2 / kl``, ``optim.*``,
``checkpoint.*``, ``steps``,
``batch_size``, ``seed``, ``eval_every``, ``output_dir``. Rerunning with the same
``output_dir`` resumes. The result is ``{output_dir}/vae/`` (diffusers folder),
``metrics.jsonl``, ``loss.png`` and ``summary.json`` (held-out PSNR, latent statistics).

Exit 2 for a config that cannot run, 1 when training fails (data, checkpoint, non-finite
loss), 143 (SIGTERM) or 130 (Ctrl-C) when interrupted by a signal after saving.
"""

from __future__ import annotations

from ditax.cli import CommandFailed


def add_arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("config", nargs="?", default=None, help="YAML file (optional)")
    p.add_argument("overrides", nargs="*", default=[], help="key=value config overrides")
    p.add_argument("--devices", type=int, default=1,
                   help="data-parallel devices (batch_size must divide)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--family", default=None,
                   help="model family whose VAE trainer runs (default: wan)")


def run(args) -> int:
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config:          # no YAML, only overrides
        config, overrides = None, [config, *overrides]
    from ditax.models import registry
    from ditax.models.base import DEFAULT_FAMILY, family_class

    family = args.family or DEFAULT_FAMILY
    registry.require(family, "train_vae", f"ditax train-vae --family {family}",
                     "train the VAE of a family that has a VAE trainer (--family wan|flux)")
    trainer = family_class(family).trainer("vae")
    cfg = trainer.load_config(config, overrides)

    import jax

    from ditax.errors import ConfigError

    if not 1 <= args.devices <= jax.device_count():
        raise ConfigError(f"--devices={args.devices}: this process has {jax.device_count()} "
                          f"devices; use --devices 1 to {jax.device_count()}")
    from ditax.train.checkpoint import CheckpointError
    from ditax.train.loop import NonFiniteLoss

    trainer.check_devices(cfg, args.devices)
    try:
        res = trainer.train(cfg, devices=jax.devices()[:args.devices],
                            progress=not args.no_progress)
    except (CheckpointError, NonFiniteLoss) as e:
        raise CommandFailed(str(e)) from e
    if res.interrupted:
        return 128 + res.signal      # 143 SIGTERM, 130 SIGINT
    last = f", last loss {res.losses[-1]:.6f}" if res.losses else ""
    psnr = f", held-out PSNR {res.eval_psnr:.2f} dB" if res.eval_psnr is not None else ""
    print(f"ditax train-vae: at step {res.step}{last}{psnr}; folder {res.folder}")
    return 0
