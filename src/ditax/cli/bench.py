"""``ditax bench CONFIG [key=value ...]``: forward time of a config with random weights.

The model family of the config (``model.family``; e.g. ``ditax bench flux-tiny``) supplies its
random transformer and its inputs. Prints one JSON line (median of ``--repeats`` runs after a compile run) on whatever devices
JAX sees, with the mesh and attention backend from the config
(:func:`ditax.bench.forward_benchmark`). For comparisons against a peer use the scripts in
``benchmarks/``. The compile run uses jax's persistent compilation cache
(:mod:`ditax.compile_cache`; ``compile_cache=none`` turns it off), so its time is a cache read
when the same program was compiled before.
"""

from __future__ import annotations

import argparse
import json

from ditax.cli import latent_arg


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", default=[])
    p.add_argument("--latent", type=latent_arg, default=None,
                   help="latent F,Y,X (default: the model family's; Wan 5,32,32, Flux one "
                        "frame 1,32,32)")
    p.add_argument("--text-len", type=int, default=512, help="text tokens (default 512)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-progress", action="store_true", help="no status line on stderr")


def run(args) -> int:
    import jax

    from ditax.bench import forward_benchmark
    from ditax.front.run import run_context
    from ditax.models.common.fields import matmul_precision
    from ditax.config import load_config, validate
    from ditax.config.families import check_capabilities
    from ditax.models import registry
    from ditax.parallel import make_mesh

    cfg = load_config(args.config, args.overrides)
    registry.require(cfg.model.family, "bench", f"ditax bench {args.config}",
                     "bench a config of a family that has one (e.g. ditax bench tiny)")
    check_capabilities(cfg, "ditax bench")
    validate(cfg, jax.device_count())
    mesh = make_mesh(cfg.mesh)
    with run_context(cfg.attention, mesh, compile_cache=cfg.compile_cache,
                     status=not args.no_progress, phase="bench",
                     precision=matmul_precision(cfg.model)):
        row = forward_benchmark(cfg, mesh, args.latent, args.text_len, args.repeats)
    print(json.dumps(row))
    return 0
