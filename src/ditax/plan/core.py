"""Mesh, parameter shardings and the compiled programs of a config (what ``ditax plan`` prints).

Nothing is allocated: the model is built abstractly, its parameters get their shardings from
the model family, and (with ``compile_``) the forward — and with ``train`` one training step of
the public :class:`~ditax.train.step.Trainer` — is lowered from abstract shapes and compiled
for the mesh's devices, which may be a deviceless TPU topology
(:func:`ditax.plan.targets.topology_devices`). Use it to choose a mesh before renting devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from ditax.nn.offload import placement


def _params(state, shardings) -> tuple[int, int, int, list]:
    total = per_dev = count = 0
    rows = []
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    for (path, leaf), s in zip(flat, jax.tree.leaves(shardings)):
        size = jnp.dtype(leaf.dtype).itemsize
        count += int(np.prod(leaf.shape))
        total += int(np.prod(leaf.shape)) * size
        per_dev += int(np.prod(s.shard_shape(leaf.shape))) * size
        name = ".".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path[:-1])
        rows.append((name, tuple(leaf.shape), str(s.spec)))
    return count, total, per_dev, rows


def _forward(cfg, mesh, family, gdef, state, shardings, latent, batch=None):
    """Lowered forward on latents ``[B, C, F, Y, X]`` (B = ``batch``, default the mesh's batch
    shards; 2 is a batched-CFG denoising step), with the family's image condition
    (image-to-video: condition channels, CLIP tokens, per-token timesteps) as the pipeline
    feeds it."""
    from flax import nnx

    from ditax.parallel.axes import batch_entry, batch_shards

    f, y, x = latent
    b = batch or batch_shards(mesh)
    bsh = NamedSharding(mesh, P(batch_entry(mesh)))
    dt = jnp.dtype(cfg.model.dtype)
    lat = jax.ShapeDtypeStruct((b, family.latent_channels, f, y, x), dt, sharding=bsh)
    t = jax.ShapeDtypeStruct((b,), jnp.float32, sharding=bsh)
    text = jax.ShapeDtypeStruct((b, cfg.sample.max_sequence_length, family.text_dim), dt,
                                sharding=bsh)
    cond = {k: jax.ShapeDtypeStruct((b, *shape), dt, sharding=bsh) for k, shape in
            family.condition_shapes((family.latent_channels, f, y, x)).items()}

    def fwd(state, lat, t, text, cond):
        lat, t, _ = family.training_inputs(lat, lat, t, cond or None)
        return family.apply(nnx.merge(gdef, state), lat, t, text, None, cond or None)

    # the parameters as ShapeDtypeStructs with their shardings, so their memory kinds (host
    # under model.offload=host) are the traced values' too
    # (8-bit host kernels in the layout the loader gives them: ditax.nn.offload.placement)
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=placement(s, a.dtype, len(a.shape))), state, shardings)
    lowered = jax.jit(fwd, in_shardings=(shardings, bsh, bsh, bsh, bsh)).lower(
        state, lat, t, text, cond)
    fl = family.flops_per_sample((family.latent_channels, f, y, x),
                                 cfg.sample.max_sequence_length) / 3.0 * b
    return lowered, [b, family.latent_channels, f, y, x], fl / mesh.size


def _train_step(cfg, mesh, family):
    """Lowered training step of the trainer ``cfg`` asks for
    (:func:`~ditax.train.trainers.make_trainer`: the flow-matching
    :class:`~ditax.train.step.Trainer`, or with ``distill.method=dmd2`` the
    :class:`~ditax.train.distill.DistillTrainer`) on one global batch; returns
    ``(lowered, latents shape, model FLOPs per device, what the step is)``."""
    from ditax.train.trainers import make_trainer

    trainer = make_trainer(cfg, mesh)
    shape, buckets = train_shape(cfg)
    B, T = cfg.batch_size, cfg.data.text_len
    sh = trainer.batch_sh
    batch = {"latents": jax.ShapeDtypeStruct((B,) + shape, jnp.float32, sharding=sh["latents"]),
             "text": jax.ShapeDtypeStruct((B, T, family.text_dim), jnp.float32,
                                          sharding=sh["text"]),
             "text_mask": jax.ShapeDtypeStruct((B, T), jnp.uint8, sharding=sh["text_mask"])}
    for k, cshape in family.condition_shapes(shape).items():
        batch[k] = jax.ShapeDtypeStruct((B, *cshape), jnp.float32, sharding=sh[k])
    distill = cfg.distill.method != "none"
    fl = train_step_flops(cfg, family, shape, getattr(trainer, "flops_factor", 1.0),
                          getattr(trainer, "sample_flops", lambda *_: None)(shape, T))
    about = {"state_bytes_per_device": _state_bytes(trainer.abstract_state())}
    if buckets:
        about["bucket"], about["buckets"] = buckets[0], buckets[1]
    if distill:
        d = cfg.distill
        about["distill"] = {"method": d.method, "steps": d.steps,
                            "critic_updates": d.critic_updates, "guidance": d.guidance,
                            "lora_rank": cfg.lora.rank, "flops_factor": trainer.flops_factor}
        lowered = trainer.lower(batch, _null_text(cfg, family, mesh))
    else:
        lowered = trainer.lower(batch)
    return lowered, [B, *shape], fl / mesh.size, about


def train_shape(cfg) -> tuple[tuple[int, ...], tuple | None]:
    """The latents ``[C, F, Y, X]`` a training plan sizes, and ``(bucket, every bucket's
    name)`` when they come from a bucketed dataset: a local ``data.source`` written with
    buckets (``meta.json`` version 2) plans its largest bucket (most latent elements: the step's
    memory peak; each bucket compiles its own program, the others are smaller); otherwise
    ``data.num_frames x height x width`` (:func:`~ditax.train.data.latent_shape_for`), as for a
    one-shape dataset or a dataset at a URL (not downloaded to plan)."""
    import math
    import pathlib

    from ditax.train.data import dataset_buckets, latent_shape_for, read_meta

    src = str(cfg.data.source)
    if src != "synthetic" and "://" not in src and (pathlib.Path(src) / "meta.json").is_file():
        meta = read_meta(src)
        if meta.get("version") == 2:
            found = dataset_buckets(meta)
            big = max(found, key=lambda b: math.prod(b["latent_shape"]))
            return tuple(big["latent_shape"]), (big["name"], [b["name"] for b in found])
    return tuple(latent_shape_for(cfg)), None


def train_step_flops(cfg, family, shape, factor: float = 1.0,
                     per_sample: float | None = None) -> float:
    """Model FLOPs of one training step on ``cfg.batch_size`` latents ``[C, F, Y, X]``
    (all devices): ``factor`` forward + backward passes' worth of the family's transformer
    work (a trainer's ``flops_factor``: 1 for flow matching, 4/3 towards a dense teacher), or
    ``per_sample`` a sample where the trainer counts it (a sparse DMD2 student beside dense
    scores: ``sample_flops``), plus what the remat policy runs again in each backward pass
    (DMD2: one a critic update and one for the student; at the family's cost)."""
    B, T = cfg.batch_size, cfg.data.text_len
    backwards = cfg.distill.critic_updates + 1 if cfg.distill.method != "none" else 1
    fl = family.flops_per_sample(shape, T) * B * factor if per_sample is None else \
        per_sample * B
    recompute = getattr(family, "recompute_flops_per_sample", None)
    if recompute is not None:    # what the family's remat policy runs again in the backward
        fl += recompute(shape, T) * B * backwards
    elif getattr(cfg.model, "remat", "none") == "full":
        fl += family.flops_per_sample(shape, T) * B / 3.0 * backwards   # the forward again
    return fl


def _null_text(cfg, family, mesh) -> dict:
    """The abstract empty-prompt embedding a distillation step takes (the teacher's
    unconditional branch, replicated): ``text [T, Dt]`` and ``text_mask [T]``, none without
    guidance. A dataset's extra text outputs (Flux's pooled vector) are left out: the
    unconditional branch then keeps the sample's, the same work and memory."""
    if cfg.distill.guidance == 1.0:
        return {}
    rep = NamedSharding(mesh, P())
    T = cfg.data.text_len
    return {"text": jax.ShapeDtypeStruct((T, family.text_dim), jnp.float32, sharding=rep),
            "text_mask": jax.ShapeDtypeStruct((T,), jnp.uint8, sharding=rep)}


def _state_bytes(abstract_state: dict) -> dict:
    """Bytes per device of each top-level entry of a train state (``params``, ``opt``; a
    distillation's ``fake``, ``fake_opt``, ``frozen``): each leaf's shard as its sharding
    places it (a replicated leaf counts whole on every device)."""
    out = {}
    for name, tree in abstract_state.items():
        out[name] = 0
        for leaf in jax.tree.leaves(tree):
            size = jnp.dtype(leaf.dtype).itemsize
            out[name] += int(np.prod(leaf.sharding.shard_shape(leaf.shape))) * size
    return out


def plan(cfg, mesh, latent=None, compile_=False, *, train=False, chip=None,
         hlo_path=None, train_hlo_path=None, batch=None) -> dict:
    """Parameter count, bytes in total and per device, and every parameter's sharding on
    ``mesh``. With ``compile_``, ``"forward"``: the compiled forward for latents
    ``[B, C, F, Y, X]`` (``latent = (F, Y, X)``, default from ``cfg.sample``; B = the mesh's
    batch shards) measured by :func:`ditax.plan.measure.measure` (per-device memory, copies,
    collectives, FLOPs; on ``chip``, a :class:`~ditax.plan.targets.Chip`: a roofline, the
    device peak a chip shows and whether it fits). With ``train``, ``"train_step"``: the same
    for one optimiser step on ``cfg.batch_size`` samples of ``cfg.data``'s size
    (``distill.method=dmd2``: one student update with its critic updates; ``"distill"`` says
    which), with the train state's bytes per device by entry
    (``"state_bytes_per_device"``). ``hlo_path`` / ``train_hlo_path``: write the forward's / the
    training step's compiled HLO text there. ``batch``: the forward's batch instead of the
    mesh's batch shards (:mod:`ditax.plan.fit` compiles a batched-CFG step with 2).
    Returns a JSON-ready dict.
    """
    from flax import nnx

    from ditax.models.base import model_family

    family = model_family(cfg.model, cfg.attention)
    model = family.abstract(mesh)
    quant = _quantize(cfg.model, model, list(mesh.devices.flat))
    gdef, state = nnx.split(model)
    sh = family.param_shardings(state, mesh)
    count, total, per_dev, rows = _params(state, sh)
    out = {"mesh": dict(mesh.shape), "platform": mesh.devices.flat[0].platform,
           "params": count, "param_bytes_total": total, "param_bytes_per_device": per_dev,
           "shardings": rows, **quant}
    layers = getattr(cfg.model, "num_layers", None)
    if getattr(cfg.attention, "sparsity", "none") != "none":
        out["sparsity"] = _sparsity(cfg, family, latent, mesh.shape.get("context", 1))
    if compile_:
        latent = latent or family.latent_shape(cfg.sample.num_frames, cfg.sample.height,
                                               cfg.sample.width)[1:]
        lowered, shape, fl = _forward(cfg, mesh, family, gdef, state, sh, latent, batch)
        out["forward"] = {"latent": shape, **_compiled(lowered, fl, layers, chip, hlo_path)}
    if train:
        lowered, shape, fl, about = _train_step(cfg, mesh, family)
        out["train_step"] = {"latents": shape, **about,
                             **_compiled(lowered, fl, layers, chip, train_hlo_path)}
    return out


def _sparsity(cfg, family, latent, shards: int = 1) -> dict | None:
    """``attention.sparsity``'s layout of the forward's latent grid (``latent = (F, Y, X)``,
    default from ``cfg.sample``) in patches on ``shards`` context shards: the tile (``auto``
    resolved), the padded tokens (:func:`~ditax.attention.sparse.layout.
    latent_layout_summary`)."""
    from ditax.attention.sparse.layout import latent_layout_summary

    latent = latent or family.latent_shape(cfg.sample.num_frames, cfg.sample.height,
                                           cfg.sample.width)[1:]
    return latent_layout_summary(cfg.attention, cfg.model, latent, shards)


def _quantize(model_cfg, model, devices) -> dict:
    """``model.quantize``: the abstract model's block linears made 8-bit as the loader makes
    them (:func:`ditax.nn.quant.quantize_module`: 8-bit kernels + float32 scales, so the
    bytes and the compiled dots are the quantized model's); ``{"quantize": ...}`` says the
    mode and whether its dots are native 8-bit on ``devices``. ``{}`` unquantized."""
    mode = getattr(model_cfg, "quantize", "none")
    if mode == "none":
        return {}
    from ditax.nn.quant import describe, native_dots, quantize_module

    act = model_cfg.quantize_activations
    quantize_module(model, mode, act, devices)
    d = devices[0]
    return {"quantize": {"mode": mode, "activations": act,
                         "native_dots": native_dots(mode, act, d.platform,
                                                    getattr(d, "device_kind", "")),
                         "dots": describe(mode, act, devices)}}


def _compiled(lowered, model_flops, layers, chip, hlo_path) -> dict:
    """:func:`~ditax.plan.measure.measure` of the compiled program, or — when XLA refuses
    because the program does not fit the device's memory — ``fits: False`` and its message."""
    from ditax.plan.measure import compile_timed, measure

    try:
        compiled, secs = compile_timed(lowered)
    except Exception as e:  # XlaRuntimeError; its type is not public API
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return {"fits": False, "error": str(e).strip().splitlines()[0]}
    return measure(compiled, compile_s=secs, model_flops=model_flops, num_layers=layers,
                   chip=chip, hlo_path=hlo_path)
