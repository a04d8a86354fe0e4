"""LTX-2's forward compiled for a TPU slice without one: ditax's beside maxdiffusion's (issue 46).

Both transformers are built abstractly (no weights: ``nnx.eval_shape``), LTX-2's 19 B config
(ditax's ``ltx-2`` preset, the diffusers config of Lightricks/LTX-2), bf16 weights and
activations, and their forward of both streams (video + audio) is lowered and compiled for the
same deviceless mesh the way ``ditax plan ltx-2 --target ... --compile`` does
(:func:`ditax.plan.targets.topology_devices`; default tpu-v6e-8, fsdp 8, one video per chip:
batch 8; 768x512x121 = video latents 16x16x24 = 6,144 tokens, 126 audio tokens, 1,024 text
tokens a stream). One JSON object per line and implementation, per chip:
``argument_bytes + temp_bytes`` and XLA's ``peak_bytes`` (``memory_analysis``),
``cost_flops`` (XLA's ``cost_analysis``; neither counts the Pallas attention kernels'
FLOPs), ``copy_ops`` / ``copy_bytes`` (relayout copies in the optimized HLO, ditax's audit),
collectives and the roofline of :mod:`ditax.plan.measure`; the maxdiffusion row adds
``baseline`` (ditax's value) and ``ratio`` (maxdiffusion / ditax) for the peak.

maxdiffusion as its LTX-2 pipeline builds it (``pipelines/ltx2/ltx2_pipeline.py``
``create_sharded_logical_transformer`` and ``transformer_forward_pass``): the config's
``logical_axis_rules``, ``attention``, ``flash_block_sizes`` and ``flash_min_seq_length`` from
its ``configs/ltx2_video.yml``, ``scan_layers``, the hardware-detected sharding strategy
(``trillium`` on v6e, ``ironwood`` on v7x: its ``get_tpu_type`` reads the device kind, here
the target's rather than the host's CPU), norms / ``scale_shift_table`` / condition embedder
kept float32 as its loader casts them, latents float32 as its denoising loop passes them.
The mesh (``data, fsdp, context, tensor``) and the device order are ditax's, shared by both.

maxdiffusion is not a ditax dependency: point ``--maxdiffusion`` at the ``src`` folder of a
checkout (github.com/AI-Hypercomputer/maxdiffusion) and put the few packages its model
modules import and ditax's venv lacks on ``PYTHONPATH`` (einops, aqtp, chex, toolz; e.g.
``pip install --target /tmp/mdpkgs --no-deps einops aqtp chex toolz``). Its ``max_utils``
imports the Google Cloud Storage client at import time; where that is missing a stub module
stands in (nothing here touches GCS).

    PYTHONPATH=/tmp/mdpkgs python benchmarks/ltx2_peer.py --maxdiffusion /tmp/md/src \\
        [--target tpu-v6e-8] [--height 512 --width 768 --frames 121] [--text 1024] \\
        [--layers 48] [--skip ditax|maxdiffusion] [--set mesh.data=2 mesh.context=4] \\
        >> docs/ltx2_peer_v6e8.jsonl
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # the host's own backend; the target is a topology

from peer_common import ditax_forward, emit, md_config, stub_gcs, summary  # noqa: E402

AUDIO_TOKENS = 126      # 121 frames at 24 fps = 5.04 s of 16 kHz audio, hop 160, 4x: 126 latents
#: maxdiffusion's loader keeps these parameters float32 (its ``_CAST_EXCLUSION_PATTERN``)
KEEP_F32 = re.compile(r"(^|\.)(norm[0-9]*|.*_norm[0-9]*|norm_out|condition_embedder|"
                      r"scale_shift_table)(\.|$)")


def maxdiffusion_forward(cfg, mesh, chip, src, latent):
    """maxdiffusion's LTX-2 transformer, abstract, compiled for ``mesh``'s devices."""
    sys.path.insert(0, src)
    stub_gcs()
    import inspect

    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from jax.sharding import NamedSharding, PartitionSpec as P

    import maxdiffusion.tpu_utils as tpu_utils
    from maxdiffusion.models.ltx2 import transformer_ltx2
    from maxdiffusion.common_types import BlockSizes
    from ditax.parallel.axes import batch_entry, batch_shards
    from ditax.plan.measure import compile_timed

    kind = mesh.devices.flat[0].device_kind      # what get_tpu_type would read on the TPU host
    tpu = (tpu_utils.TpuType.TPU_7X if "7x" in kind else tpu_utils.TpuType.TPU_V6_LITE
           if "v6 lite" in kind else tpu_utils.TpuType.UNKNOWN)
    for name, mod in list(sys.modules.items()):
        if name.startswith("maxdiffusion") and hasattr(mod, "get_tpu_type"):
            mod.get_tpu_type = lambda: tpu

    mdc = md_config(src, "ltx2_video.yml")
    rules = tuple(tuple(r) if isinstance(r, list) else r for r in mdc["logical_axis_rules"])
    rules = tuple((r[0], tuple(r[1]) if isinstance(r[1], list) else r[1]) for r in rules)
    fbs = mdc["flash_block_sizes"]
    blocks = BlockSizes(block_q=fbs["block_q"], block_kv=fbs["block_kv"],
                        block_kv_compute=fbs["block_kv_compute"],
                        block_q_dkv=fbs.get("block_q_dkv"), block_kv_dkv=fbs.get("block_kv_dkv"),
                        block_kv_dkv_compute=fbs.get("block_kv_dkv_compute"),
                        use_fused_bwd_kernel=bool(fbs.get("use_fused_bwd_kernel")))
    Model = transformer_ltx2.LTX2VideoTransformer3DModel
    accepted = set(inspect.signature(Model.__init__).parameters)
    shape = {k: getattr(cfg.model, k) for k in accepted if hasattr(cfg.model, k)
             and k not in ("dtype", "mesh", "scan_layers", "remat_policy")}
    if isinstance(shape.get("vae_scale_factors"), list):
        shape["vae_scale_factors"] = tuple(shape["vae_scale_factors"])
    if shape.get("activation_fn") == "gelu-approximate":   # as its pipeline maps it
        shape["activation_fn"] = "gelu"
    kw = dict(shape, mesh=mesh, dtype=jnp.bfloat16, weights_dtype=jnp.bfloat16,
              scan_layers=bool(mdc["scan_layers"]), remat_policy=mdc["remat_policy"],
              attention_kernel=mdc["attention"], a2v_attention_kernel=mdc["a2v_attention_kernel"],
              v2a_attention_kernel=mdc["v2a_attention_kernel"], flash_block_sizes=blocks,
              flash_min_seq_length=mdc["flash_min_seq_length"],
              precision=jax.lax.Precision.DEFAULT,
              sharding_specs=transformer_ltx2.get_sharding_specs("default", "ltx2_dit"))

    with mesh, nn_partitioning.axis_rules(rules):
        model = nnx.eval_shape(lambda: Model(rngs=nnx.Rngs(0), **kw))
        gdef, params, rest = nnx.split(model, nnx.Param, ...)
        logical = nnx.get_partition_spec(params)
        shard = nn.logical_to_mesh_sharding(logical, mesh, rules)

    def abstract(path, leaf, s):
        name = ".".join(str(getattr(k, "key", k)) for k in path).lower()
        dt = jnp.float32 if KEEP_F32.search(name) else jnp.bfloat16
        return jax.ShapeDtypeStruct(leaf.shape, dt, sharding=s)

    p_abs = jax.tree_util.tree_map_with_path(
        abstract, nnx.to_pure_dict(params), nnx.to_pure_dict(shard))
    p_sh = jax.tree.map(lambda x: x.sharding, p_abs)
    rep = NamedSharding(mesh, P())
    r_abs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep),
                         nnx.to_pure_dict(rest))
    counted = sum(int(x.size) for x in jax.tree.leaves(p_abs))

    f, y, x = latent
    b = batch_shards(mesh)
    bsh = NamedSharding(mesh, P(batch_entry(mesh)))
    T = cfg.sample.max_sequence_length
    C = cfg.model.in_channels
    lat = jax.ShapeDtypeStruct((b, f * y * x, C), jnp.float32, sharding=bsh)
    alat = jax.ShapeDtypeStruct((b, AUDIO_TOKENS, cfg.model.audio_in_channels), jnp.float32,
                                sharding=bsh)
    text = jax.ShapeDtypeStruct((b, T, cfg.model.caption_channels), jnp.bfloat16, sharding=bsh)
    t = jax.ShapeDtypeStruct((b,), jnp.float32, sharding=bsh)

    def fwd(p, r, lat, alat, text, atext, t):
        m = nnx.merge(gdef, p, r)
        with nn_partitioning.axis_rules(rules):
            return m(hidden_states=lat, audio_hidden_states=alat, encoder_hidden_states=text,
                     audio_encoder_hidden_states=atext, timestep=t, sigma=t, audio_sigma=t,
                     num_frames=f, height=y, width=x, fps=24.0, audio_num_frames=AUDIO_TOKENS,
                     return_dict=False)

    rsh = jax.tree.map(lambda x: x.sharding, r_abs)
    with mesh:
        lowered = jax.jit(fwd, in_shardings=(p_sh, rsh, bsh, bsh, bsh, bsh, bsh)).lower(
            p_abs, r_abs, lat, alat, text, text, t)
    compiled, secs = compile_timed(lowered)
    return compiled, secs, counted, {"rules": [list(map(str, r)) for r in rules],
                                     "attention": mdc["attention"], "tpu_type": tpu.value}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--maxdiffusion", default=os.environ.get("MAXDIFFUSION_SRC"),
                    help="the src/ folder of a maxdiffusion checkout")
    ap.add_argument("--target", default="tpu-v6e-8")
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--frames", type=int, default=121)
    ap.add_argument("--text", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--skip", default="", help="ditax and/or maxdiffusion, comma-separated")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more config overrides for both (e.g. mesh.data=2 mesh.context=4)")
    ap.add_argument("--dump-hlo", default=None, metavar="DIR",
                    help="write each compiled forward's HLO text to DIR/<impl>.hlo")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    if "maxdiffusion" not in skip and not a.maxdiffusion:
        ap.error("--maxdiffusion SRC (or MAXDIFFUSION_SRC) is needed unless "
                 "--skip maxdiffusion")

    from ditax.config import load_config
    from ditax.parallel import make_mesh
    from ditax.plan.targets import parse_target, topology_devices

    target = parse_target(a.target)
    devices = topology_devices(target)
    cfg = load_config("ltx-2", [f"sample.height={a.height}", f"sample.width={a.width}",
                                f"sample.num_frames={a.frames}",
                                f"sample.max_sequence_length={a.text}",
                                f"model.num_layers={a.layers}", *a.set])
    mesh = make_mesh(cfg.mesh, devices)
    case = f"forward_{a.width}x{a.height}x{a.frames}"
    base = {"bench": "ltx2_peer", "case": case, "target": a.target, "mesh": dict(mesh.shape),
            "layers": a.layers, "text_tokens": a.text, "audio_tokens": AUDIO_TOKENS}
    ours, fl = None, None
    if a.dump_hlo is not None:
        os.makedirs(a.dump_hlo, exist_ok=True)
    hlo = lambda impl: (None if a.dump_hlo is None   # noqa: E731
                        else os.path.join(a.dump_hlo, f"{impl}.hlo"))
    if "ditax" not in skip:
        t0 = time.process_time()
        ours, fl = ditax_forward(cfg, mesh, target.chip, hlo("ditax"))
        emit({**base, "impl": "ditax", "cpu_s": round(time.process_time() - t0, 1), **ours})
    if "maxdiffusion" not in skip:
        from ditax.models.base import model_family

        family = model_family(cfg.model, cfg.attention)
        latent = family.latent_shape(cfg.sample.num_frames, cfg.sample.height,
                                     cfg.sample.width)[1:]
        if fl is None:
            fl = family.flops_per_sample((family.latent_channels, *latent), a.text) / 3.0 \
                * mesh.shape["fsdp"] * mesh.shape["data"] / mesh.size
        t0 = time.process_time()
        try:
            compiled, secs, params, about = maxdiffusion_forward(cfg, mesh, target.chip,
                                                                 a.maxdiffusion, latent)
        except Exception as e:   # say what refused, in one row
            emit({**base, "impl": "maxdiffusion",
                  "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400]}"})
            raise
        row = {**base, "impl": "maxdiffusion", "cpu_s": round(time.process_time() - t0, 1),
               "params": params, **about,
               **summary(compiled, secs, fl, a.layers, target.chip, hlo("maxdiffusion"))}
        if ours is not None:
            row["metric"], row["baseline"] = "peak_bytes", ours["peak_bytes"]
            row["ratio"] = row["peak_bytes"] / ours["peak_bytes"]
        emit(row)


if __name__ == "__main__":
    sys.exit(main())
