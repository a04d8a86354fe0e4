"""``ditax train CONFIG [key=value ...]``: flow-matching training / fine-tuning.

CONFIG is a preset name (``tiny``, ``wan2.1-t2v-1.3b`` …) or a YAML path; ``key=value``
overrides any config key, e.g. ``steps=100 batch_size=8 mesh.fsdp=8 attention.backend=ulysses
data.source=/data/latents output_dir=runs/a``. Multi-host: run the same command once per
process with ``mesh.coordinator_address=HOST:PORT mesh.num_processes=N mesh.process_id=I``.

Exit 2 for a config that cannot run (checked against the device count before training
starts); exit 1 when training fails (data, checkpoint, non-finite loss); 143 (SIGTERM) or 130 (Ctrl-C) when interrupted
by a signal after saving. Compiled programs go to jax's persistent compilation cache as for
``ditax generate`` (:mod:`ditax.compile_cache`: ``DITAX_CACHE_DIR`` / ``compile_cache=PATH``,
``none`` = off).
"""

from __future__ import annotations

from ditax.cli import CommandFailed
from ditax.errors import DitaxError


def add_arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("config", help="preset name or YAML file")
    p.add_argument("overrides", nargs="*", default=[], help="key=value config overrides")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from ditax.config import load_config, validate
    from ditax.config.families import check_capabilities

    cfg = load_config(args.config, args.overrides)
    check_capabilities(cfg, "ditax train", training=True)   # before the data is read
    if cfg.data.source != "synthetic":      # a bad data.source is a config error: say so now
        from ditax.io.remote.datasets import checked_source
        from ditax.train.data import read_meta

        source = checked_source(cfg.data.source)    # a URL: checked there, no download yet
        if source is not None:
            read_meta(source)

    import jax

    if cfg.mesh.coordinator_address is not None:
        # CPU multi-process runs need a collectives implementation; it must be chosen before
        # jax.distributed.initialize. It only affects the CPU client, so it is safe on GPU/TPU.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        from ditax.parallel.mesh import initialize_distributed

        initialize_distributed(cfg.mesh)
    validate(cfg, jax.device_count(), training=True)
    if cfg.lora.rank and cfg.init_from is None and jax.process_index() == 0:
        print(f"warning: lora.rank={cfg.lora.rank} without init_from: the adapters train on a "
              f"randomly initialised base, which no released model has; set "
              f"init_from=FOLDER (the model the adapters are for)", flush=True)

    from ditax.attention.plan import needs_entry_context
    from ditax.front.run import run_context
    from ditax.models.common.fields import matmul_precision
    from ditax.parallel.mesh import make_mesh
    from ditax.train.checkpoint import CheckpointError
    from ditax.train.data import DataError
    from ditax.train.loop import NonFiniteLoss, train

    # train() builds its own mesh; an entry context (TE's MeshResource) needs one here too
    mesh = make_mesh(cfg.mesh) if needs_entry_context(cfg.attention) else None
    try:        # the phase: an out-of-memory names it (ditax.cli.oom)
        with run_context(cfg.attention, mesh, compile_cache=cfg.compile_cache, phase="train",
                         precision=matmul_precision(cfg.model)):
            res = train(cfg, progress=not args.no_progress)
    except (DataError, CheckpointError, NonFiniteLoss) as e:
        if isinstance(e, DitaxError):       # a data.source that does not fit: exit 2
            raise
        raise CommandFailed(str(e)) from e
    if jax.process_index() == 0:
        last = f", last loss {res.losses[-1]:.6f}" if res.losses else ""
        print(f"ditax train: at step {res.step}{last}; metrics in {cfg.output_dir}/metrics.jsonl")
    return 128 + res.signal if res.interrupted else 0   # 143 SIGTERM, 130 SIGINT
