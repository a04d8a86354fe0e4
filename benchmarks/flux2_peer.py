"""FLUX.2 klein's forward compiled for a TPU slice without one: ditax's beside maxdiffusion's
(issue 47).

Both transformers are built abstractly (no weights: ``nnx.eval_shape``), FLUX.2-klein 9B's
config (ditax's ``flux.2-klein-9b`` preset: 8 double + 24 single blocks, 32 heads x 128,
Qwen3-8B features 12,288 wide), bf16 weights and activations, and one forward (one of the
distilled klein's 4 denoising steps) is lowered and compiled for the same deviceless mesh the
way ``ditax plan flux.2-klein-9b --target ... --compile`` does
(:func:`ditax.plan.targets.topology_devices`; default tpu-v6e-8, fsdp 8, one image per chip:
batch 8; 1024x1024 = 64x64 = 4,096 image tokens, 512 text tokens). One JSON object per line
and implementation, per chip: ``argument_bytes + temp_bytes`` and XLA's ``peak_bytes``
(``memory_analysis``), ``cost_flops`` (XLA's ``cost_analysis``: it counts a scanned layer
loop's body once and no Pallas kernel), ``xla_flops`` (ditax's HLO audit, loop trip counts
applied), ``copy_ops`` / ``copy_bytes`` (relayout copies in the optimized HLO), collectives
and the roofline of :mod:`ditax.plan.measure`; a maxdiffusion row adds ``baseline`` (ditax's
value) and ``ratio`` (maxdiffusion / ditax) for the peak.

maxdiffusion as its klein generator builds it (``generate_flux2klein.py`` and
``pipelines/flux/flux2klein_pipeline.py``): ``NNXFlux2KleinTransformer2DModel`` with the
arguments that script passes (``guidance_embeds=True``, ``pooled_projection_dim=768``: the
9B checkpoint fills neither embedder and the call passes neither, but the parameters exist),
``attention``, ``flash_block_sizes``, ``ulysses_*`` and ``logical_axis_rules`` from its
``configs/base_flux2klein_9B.yml``; the q/k RMSNorm scales float32 as its loader
(``load_and_convert_flux_klein_nnx_weights``) casts them; latents float32 and batch-sharded
(``_get_dynamic_batch_sharding``), prompt embeddings bf16 on its context sharding, as its
``compile_aot_async`` feeds ``transformer_step``. Variants, each combination one row (a
compile that XLA refuses is a row with ``error`` / ``detail``, and the run goes on):

- ``--md-mesh``: ``ditax`` (default) = ditax's mesh and device order (``data, fsdp, context,
  tensor`` = 1, 8, 1, 1 on 8 chips), the like-for-like comparison; ``tensor`` =
  maxdiffusion's own default for its klein generator on N chips (no ``ici_*_parallelism``
  given: ``ici_tensor_parallelism = N``), same devices, same batch;
- ``--md-vmem-kib``: ``0`` = XLA's default scoped VMEM limit (its klein command sets none; its
  ``block_q: 4608`` splash forward needs more at 1024x1024), ``65536`` = the limit its README
  passes for its other models;
- ``--md-shardings``: ``written`` = its parameter shardings as its generator computes them
  (every parameter replicated under flax >= 0.12.6, see :func:`maxdiffusion_forward`),
  ``intended`` = its logical-axis rules applied once.

maxdiffusion is not a ditax dependency: point ``--maxdiffusion`` at the ``src`` folder of a
checkout (github.com/AI-Hypercomputer/maxdiffusion) and put the few packages its model
modules import and ditax's venv lacks on ``PYTHONPATH`` (einops, aqtp, chex, toolz; e.g.
``pip install --target /tmp/mdpkgs --no-deps einops aqtp chex toolz``). Its ``max_utils``
imports the Google Cloud Storage client at import time; where that is missing a stub module
stands in (nothing here touches GCS).

    TPU_SKIP_MDS_QUERY=1 PYTHONPATH=/tmp/mdpkgs python benchmarks/flux2_peer.py \\
        --maxdiffusion /tmp/md/src [--target tpu-v6e-8] [--height 1024 --width 1024] \\
        [--text 512] [--md-mesh ditax,tensor] [--md-vmem-kib 0,65536] \\
        [--md-shardings written,intended] [--skip ditax|maxdiffusion] > rows.jsonl

(docs/flux2_peer_v6e8.jsonl: ``--md-mesh ditax,tensor --md-vmem-kib 0,65536 --md-shardings
written``, then ``--md-vmem-kib 65536 --md-shardings intended`` appended; docs/flux2_plan.md.)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # the host's own backend; the target is a topology

from peer_common import ditax_forward, emit, md_config, stub_gcs, summary  # noqa: E402

PRESET = "flux.2-klein-9b"
#: maxdiffusion's klein loader keeps these parameters float32 (``is_norm=True``)
KEEP_F32 = re.compile(r"(^|\.)(query_norm|key_norm|encoder_query_norm|encoder_key_norm)\.")
#: maxdiffusion's klein config (the 9B's)
MD_CONFIG = "base_flux2klein_9B.yml"


def tensor_mesh(mesh):
    """maxdiffusion's klein default on ``mesh``'s devices: every chip on ``tensor``."""
    from jax.sharding import Mesh

    devs = mesh.devices.reshape(1, 1, 1, mesh.size)
    return Mesh(devs, ("data", "fsdp", "context", "tensor"))


def maxdiffusion_forward(cfg, mesh, src, batch, vmem_kib=0, shardings="written"):
    """maxdiffusion's klein transformer, abstract, one forward compiled for ``mesh``'s
    devices; ``(compiled, seconds, parameter count, what was built)``.

    ``vmem_kib``: XLA's scoped VMEM limit raised to it, as maxdiffusion's README sets
    ``--xla_tpu_scoped_vmem_limit_kib=65536`` for its other models (its klein command sets
    none). ``shardings``: ``written`` = the parameter shardings exactly as
    ``generate_flux2klein.py`` computes them (``nnx.get_partition_spec`` inside
    ``nn_partitioning.axis_rules``, then ``nn.logical_to_mesh_sharding`` with the same rules:
    flax >= 0.12.6, which maxdiffusion requires, already resolves the rules in the first call,
    so the second maps mesh-axis names such as ``'fsdp'`` as if they were logical ones, finds
    no rule and leaves every parameter replicated); ``intended`` = the logical names mapped
    once (``get_partition_spec`` outside the rules), the sharding its rules describe."""
    sys.path.insert(0, src)
    stub_gcs()
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from jax.sharding import NamedSharding, PartitionSpec as P

    from maxdiffusion.max_utils import get_flash_block_sizes
    from maxdiffusion.models.flux.transformers import transformer_flux_flax as tff
    from ditax.plan.measure import compile_timed

    mdc = md_config(src, MD_CONFIG)
    rules = tuple((r[0], tuple(r[1]) if isinstance(r[1], list) else r[1])
                  for r in mdc["logical_axis_rules"])
    if batch % (mesh.shape["data"] * mesh.shape["fsdp"]):   # as generate_flux2klein falls back
        rules = tuple((k, "data") if k in ("activation_batch", "conv_batch") else (k, v)
                      for k, v in rules)
    blocks = get_flash_block_sizes(types.SimpleNamespace(
        flash_block_sizes=mdc["flash_block_sizes"], attention=mdc["attention"]))
    m = cfg.model
    kw = dict(in_channels=m.in_channels, num_layers=m.num_layers,
              num_single_layers=m.num_single_layers, attention_head_dim=m.attention_head_dim,
              num_attention_heads=m.num_attention_heads, joint_attention_dim=m.joint_attention_dim,
              pooled_projection_dim=768, guidance_embeds=True, axes_dim=tuple(m.axes_dims_rope),
              theta=m.rope_theta, mlp_ratio=m.mlp_ratio, attention_kernel=mdc["attention"],
              flash_min_seq_length=512, flash_block_sizes=blocks, mesh=mesh,
              dtype=jnp.bfloat16, weights_dtype=jnp.bfloat16,
              scale_shift_order=mdc["scale_shift_order"],
              ulysses_shards=mdc["ulysses_shards"],
              ulysses_attention_chunks=mdc["ulysses_attention_chunks"])

    with mesh, nn_partitioning.axis_rules(rules):
        model = nnx.eval_shape(lambda: tff.NNXFlux2KleinTransformer2DModel(
            rngs=nnx.Rngs(0), **kw))
        gdef, params, rest = nnx.split(model, nnx.Param, ...)
        if shardings == "written":
            shard = nn.logical_to_mesh_sharding(nnx.get_partition_spec(params), mesh, rules)
    if shardings == "intended":
        logical = nnx.get_partition_spec(params)   # no rules active: the logical names
        with mesh, nn_partitioning.axis_rules(rules):
            shard = nn.logical_to_mesh_sharding(logical, mesh, rules)

    def abstract(path, leaf, s):
        name = ".".join(str(getattr(k, "key", k)) for k in path)
        dt = jnp.float32 if KEEP_F32.search(name + ".") else jnp.bfloat16
        return jax.ShapeDtypeStruct(leaf.shape, dt, sharding=s)

    p_abs = jax.tree_util.tree_map_with_path(
        abstract, nnx.to_pure_dict(params), nnx.to_pure_dict(shard))
    p_sh = jax.tree.map(lambda x: x.sharding, p_abs)
    rep = NamedSharding(mesh, P())
    r_abs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep),
                         nnx.to_pure_dict(rest))
    rsh = jax.tree.map(lambda x: x.sharding, r_abs)
    counted = sum(int(x.size) for x in jax.tree.leaves(p_abs))

    # the pipeline's input shardings (_get_dynamic_batch_sharding, its context sharding)
    baxes = tuple(a for a in ("data", "fsdp") if mesh.shape[a] > 1)
    dsh = NamedSharding(mesh, P(baxes) if baxes else P(None))
    csh = NamedSharding(mesh, P(None, "context") if mesh.shape["context"] > 1 else P())
    S = (cfg.sample.height // 16) * (cfg.sample.width // 16)
    T = cfg.sample.max_sequence_length
    lat = jax.ShapeDtypeStruct((batch, S, m.in_channels), jnp.float32, sharding=dsh)
    img_ids = jax.ShapeDtypeStruct((batch, S, 4), jnp.int32, sharding=dsh)
    text = jax.ShapeDtypeStruct((batch, T, m.joint_attention_dim), jnp.bfloat16, sharding=csh)
    txt_ids = jax.ShapeDtypeStruct((batch, T, 4), jnp.float32, sharding=dsh)
    t = jax.ShapeDtypeStruct((batch,), jnp.float32, sharding=dsh)

    def step(p, r, lat, img_ids, text, txt_ids, t):   # its transformer_step
        out = nnx.merge(gdef, p, r)(hidden_states=lat, encoder_hidden_states=text,
                                    pooled_projections=None, timestep=t, img_ids=img_ids,
                                    txt_ids=txt_ids, guidance=None, return_dict=True)
        return out.sample

    with mesh, nn_partitioning.axis_rules(rules):
        lowered = jax.jit(step, in_shardings=(p_sh, rsh, dsh, dsh, csh, dsh, dsh)).lower(
            p_abs, r_abs, lat, img_ids, text, txt_ids, t)
    if vmem_kib:
        t0 = time.perf_counter()
        compiled = lowered.compile({"xla_tpu_scoped_vmem_limit_kib": vmem_kib})
        secs = time.perf_counter() - t0
    else:
        compiled, secs = compile_timed(lowered)
    return compiled, secs, counted, {"shardings": shardings,
                                     "rules": [[k, str(v)] for k, v in rules],
                                     "attention": mdc["attention"],
                                     "flash_block_sizes": mdc["flash_block_sizes"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--maxdiffusion", default=os.environ.get("MAXDIFFUSION_SRC"),
                    help="the src/ folder of a maxdiffusion checkout")
    ap.add_argument("--target", default="tpu-v6e-8")
    ap.add_argument("--height", type=int, default=1024)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--text", type=int, default=512)
    ap.add_argument("--md-mesh", default="ditax",
                    help="maxdiffusion's mesh(es), comma-separated: ditax (the shared one) "
                         "and/or tensor (its klein generator's default)")
    ap.add_argument("--md-vmem-kib", default="0",
                    help="maxdiffusion's scoped VMEM limit(s) in KiB, comma-separated, each "
                         "tried on each --md-mesh: 0 = XLA's default (its klein command), "
                         "65536 = what its README passes for its other models")
    ap.add_argument("--md-shardings", default="written",
                    help="maxdiffusion's parameter shardings, comma-separated: written (as its "
                         "klein generator computes them) and/or intended (its rules applied "
                         "once); see maxdiffusion_forward")
    ap.add_argument("--skip", default="", help="ditax and/or maxdiffusion, comma-separated")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    md_meshes = [x for x in a.md_mesh.split(",") if x]
    if any(x not in ("ditax", "tensor") for x in md_meshes):
        ap.error(f"--md-mesh {a.md_mesh!r}: use ditax and/or tensor")
    if any(x not in ("written", "intended") for x in a.md_shardings.split(",")):
        ap.error(f"--md-shardings {a.md_shardings!r}: use written and/or intended")
    if "maxdiffusion" not in skip and not a.maxdiffusion:
        ap.error("--maxdiffusion SRC (or MAXDIFFUSION_SRC) is needed unless "
                 "--skip maxdiffusion")

    from ditax.config import load_config
    from ditax.parallel import make_mesh
    from ditax.parallel.axes import batch_shards
    from ditax.plan.targets import parse_target, topology_devices

    target = parse_target(a.target)
    devices = topology_devices(target)
    cfg = load_config(PRESET, [f"sample.height={a.height}", f"sample.width={a.width}",
                               "sample.num_frames=1", f"sample.max_sequence_length={a.text}"])
    mesh = make_mesh(cfg.mesh, devices)
    batch = batch_shards(mesh)
    layers = cfg.model.num_layers   # as ditax plan: per_layer = one double block
    base = {"bench": "flux2_peer", "case": f"forward_{a.width}x{a.height}", "preset": PRESET,
            "target": a.target, "batch": batch, "image_tokens": (a.height // 16) * (a.width // 16),
            "text_tokens": a.text}
    ours, fl = None, None
    if "ditax" not in skip:
        t0 = time.process_time()
        ours, fl = ditax_forward(cfg, mesh, target.chip)
        emit({**base, "impl": "ditax", "mesh": dict(mesh.shape),
              "cpu_s": round(time.process_time() - t0, 1), **ours})
    if "maxdiffusion" in skip:
        return 0
    if fl is None:
        from ditax.models.base import model_family

        family = model_family(cfg.model, cfg.attention)
        latent = family.latent_shape(1, a.height, a.width)[1:]
        fl = family.flops_per_sample((family.latent_channels, *latent), a.text) / 3.0 \
            * batch / mesh.size
    failed = 0
    variants = [(sh, m, int(v)) for sh in a.md_shardings.split(",") for m in md_meshes
                for v in a.md_vmem_kib.split(",")]
    for shardings, which, vmem in variants:
        md_mesh = mesh if which == "ditax" else tensor_mesh(mesh)
        row = {**base, "impl": "maxdiffusion", "md_mesh": which, "mesh": dict(md_mesh.shape),
               "md_shardings": shardings, "scoped_vmem_limit_kib": vmem or "default"}
        t0 = time.process_time()
        try:
            compiled, secs, params, about = maxdiffusion_forward(
                cfg, md_mesh, a.maxdiffusion, batch, vmem, shardings)
        except Exception as e:   # say what refused, in one row, and go on to the next
            msg = str(e)
            lines = [x.strip() for x in msg.strip().splitlines() if x.strip()]
            why = re.findall(r"(Ran out of memory in memory space \w+ while allocating on stack"
                             r" for %\S+)|(Scoped allocation with size \S+ and limit \S+ "
                             r"exceeded[^0-9]*[0-9.]+M)", msg)
            emit({**row, "cpu_s": round(time.process_time() - t0, 1),
                  "error": f"{type(e).__name__}: {(lines or [''])[0][:200]}",
                  "detail": " ".join(dict.fromkeys(x or y for x, y in why))[:400]})
            failed += 1
            continue
        row.update({"cpu_s": round(time.process_time() - t0, 1), "params": params, **about,
                    **summary(compiled, secs, fl, layers, target.chip)})
        if ours is not None:
            row["metric"], row["baseline"] = "peak_bytes", ours["peak_bytes"]
            row["ratio"] = row["peak_bytes"] / ours["peak_bytes"]
        emit(row)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
