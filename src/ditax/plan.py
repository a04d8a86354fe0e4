"""``ditax plan CONFIG [key=value ...]``: mesh, parameter shardings and per-device memory.

Nothing is allocated: the model is built abstractly, its parameters get their shardings from
the logical rules, and (with ``--compile``) the forward is lowered and compiled from abstract
shapes so XLA's ``memory_analysis`` reports per-device temporaries. Use it to choose a mesh
before renting devices (``--devices N`` simulates N CPU devices).
"""

from __future__ import annotations

import argparse
import json
import os


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("config", help="preset name (tiny, wan2.1-t2v-1.3b, ...) or YAML path")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. mesh.context=8")
    p.add_argument("--devices", type=int, default=None,
                   help="simulate N CPU devices (sets XLA_FLAGS before JAX starts)")
    p.add_argument("--latent", default=None,
                   help="latent F,Y,X for --compile (default: from sample.* of the config)")
    p.add_argument("--compile", action="store_true", help="also compile the forward abstractly")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def plan(cfg, mesh, latent=None, compile_=False) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from ditax.models.wan.loading import abstract_model, param_shardings

    abs_m = abstract_model(cfg.model, cfg.attention, mesh)
    gdef, state = nnx.split(abs_m)
    sh = param_shardings(state, cfg.model, mesh)
    total = 0
    per_dev = 0
    rows = []
    for (path, leaf), s in zip(jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(sh)):
        nbytes = int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
        local = int(np.prod(s.shard_shape(leaf.shape))) * jnp.dtype(leaf.dtype).itemsize
        total += nbytes
        per_dev += local
        name = ".".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path[:-1])
        rows.append((name, tuple(leaf.shape), str(s.spec)))
    out = {"mesh": dict(mesh.shape), "params": sum(int(np.prod(l.shape)) for l in jax.tree.leaves(state)),
           "param_bytes_total": total, "param_bytes_per_device": per_dev,
           "shardings": rows}
    if compile_:
        f, y, x = latent or (
            (cfg.sample.num_frames - 1) // 4 + 1, cfg.sample.height // 8, cfg.sample.width // 8)
        dt = jnp.dtype(cfg.model.dtype)
        bsh = mesh.shape["data"] * mesh.shape["fsdp"]
        lat = jax.ShapeDtypeStruct((bsh, cfg.model.in_channels, f, y, x), dt)
        t = jax.ShapeDtypeStruct((bsh,), jnp.float32)
        text = jax.ShapeDtypeStruct((bsh, cfg.sample.max_sequence_length, cfg.model.text_dim), dt)

        def fwd(state, lat, t, text):
            return nnx.merge(gdef, state)(lat, t, text)

        comp = jax.jit(fwd, in_shardings=(sh, None, None, None)).lower(state, lat, t, text).compile()
        ma = comp.memory_analysis()
        out["forward"] = {"latent": [bsh, cfg.model.in_channels, f, y, x],
                          "temp_bytes": getattr(ma, "temp_size_in_bytes", None),
                          "argument_bytes": getattr(ma, "argument_size_in_bytes", None),
                          "output_bytes": getattr(ma, "output_size_in_bytes", None)}
    return out


def run(args) -> int:
    if args.devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.devices}")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from ditax.config import load_config, validate
    from ditax.parallel import make_mesh

    cfg = load_config(args.config, args.overrides)
    validate(cfg, jax.device_count())
    mesh = make_mesh(cfg.mesh)
    latent = tuple(int(v) for v in args.latent.split(",")) if args.latent else None
    out = plan(cfg, mesh, latent, args.compile)
    if args.json:
        print(json.dumps(out))
        return 0
    gib = 2 ** 30
    print(f"config {cfg.name}: mesh {out['mesh']} on {jax.device_count()} "
          f"{jax.devices()[0].platform} devices")
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
