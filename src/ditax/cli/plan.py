"""``ditax plan CONFIG [key=value ...]``: mesh, parameter shardings and per-device memory.

Nothing is allocated (:func:`ditax.plan.plan`). ``--devices N`` plans for N CPU devices: when
JAX has not started yet (the ``ditax`` command), this process's JAX is set up with N simulated
CPU devices before it starts; the mesh is always built from ``jax.devices("cpu")``, so the
platform is chosen through the mesh and never by changing the environment of a running JAX.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ditax.cli import latent_arg
from ditax.errors import RequestError


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("config", help="preset name (tiny, wan2.1-t2v-1.3b, ...) or YAML path")
    p.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. mesh.context=8")
    p.add_argument("--devices", type=int, default=None,
                   help="plan for N CPU devices (simulated when JAX starts)")
    p.add_argument("--latent", type=latent_arg, default=None,
                   help="latent F,Y,X for --compile (default: from sample.* of the config)")
    p.add_argument("--compile", action="store_true", help="also compile the forward abstractly")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def simulated_cpu_devices(n: int) -> list:
    """N CPU devices for the mesh. If JAX has not started, it is first told to start with (at
    least) N host devices on the CPU platform; if it has, the CPU devices it has must do."""
    if n < 1:
        raise RequestError(f"--devices={n} must be >= 1")
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={n}").strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    devices = jax.devices("cpu")
    if len(devices) < n:
        raise RequestError(f"--devices={n}: JAX already started in this process with "
                           f"{len(devices)} CPU device(s); run `ditax plan` as its own command "
                           f"(it sets up N CPU devices before JAX starts)")
    return devices[:n]


def run(args) -> int:
    devices = simulated_cpu_devices(args.devices) if args.devices is not None else None
    import jax

    from ditax.config import load_config, validate
    from ditax.parallel import make_mesh
    from ditax.plan import plan

    devices = jax.devices() if devices is None else devices
    cfg = load_config(args.config, args.overrides)
    validate(cfg, len(devices))
    mesh = make_mesh(cfg.mesh, devices)
    out = plan(cfg, mesh, args.latent, args.compile)
    if args.json:
        print(json.dumps(out))
        return 0
    gib = 2 ** 30
    print(f"config {cfg.name}: mesh {out['mesh']} on {len(devices)} {devices[0].platform} "
          f"devices")
    print(f"parameters: {out['params'] / 1e9:.3f} B, {out['param_bytes_total'] / gib:.2f} GiB "
          f"total, {out['param_bytes_per_device'] / gib:.3f} GiB per device")
    seen = set()
    for name, shape, spec in out["shardings"]:
        key = (name.split(".")[-1], spec)
        if key in seen:
            continue
        seen.add(key)
        print(f"  {name:45s} {str(shape):24s} {spec}")
    if "forward" in out:
        fw = out["forward"]
        print(f"forward {fw['latent']}: temp {fw['temp_bytes'] / gib:.2f} GiB per device, "
              f"arguments {fw['argument_bytes'] / gib:.2f} GiB")
    return 0
