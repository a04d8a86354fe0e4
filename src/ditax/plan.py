"""Mesh, parameter shardings and per-device memory of a config (what ``ditax plan`` prints).

Nothing is allocated: the model is built abstractly, its parameters get their shardings from
the logical rules, and (with ``compile_``) the forward is lowered and compiled from abstract
shapes so XLA's ``memory_analysis`` reports per-device temporaries. Use it to choose a mesh
before renting devices.
"""

from __future__ import annotations


def plan(cfg, mesh, latent=None, compile_=False) -> dict:
    """Parameter count, bytes in total and per device, and every parameter's sharding on
    ``mesh``; with ``compile_`` also the compiled forward's per-device memory for latents
    ``[B, C, F, Y, X]`` (``latent = (F, Y, X)``, default from ``cfg.sample``; ``B`` = the mesh's
    batch shards). Returns a JSON-ready dict."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from ditax.models.wan.loading import abstract_model, param_shardings
    from ditax.parallel.axes import batch_shards
    from ditax.models.wan.vae.config import WanVAEConfig

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
        f, y, x = latent or WanVAEConfig().latent_grid(
            cfg.sample.num_frames, cfg.sample.height, cfg.sample.width)
        dt = jnp.dtype(cfg.model.dtype)
        bsh = batch_shards(mesh)
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

