"""The causal chunk program compiled for a TPU without one (issue 59 item 5): one JSON object,

    {"bench": "causal_chunk_plan", "case": ..., "target": ..., "hbm_bytes": ..., ...}

:func:`ditax.pipelines.causal._chunk_program` (``--steps`` Euler steps + the clean cache
write, the KV cache holding the sink and ``--context-chunks`` chunks) of a Wan transformer of
``benchmarks/causal_stream.py``'s ``--size`` at ``--height`` x ``--width``, lowered from
abstract shapes and compiled deviceless for ``--target`` (libtpu's topology, as
``ditax plan --target``). Reported: the plan's measure (:func:`ditax.plan.measure.measure`:
HBM bytes, copies, memory, roofline; per layer), XLA's cost analysis and its cycle estimates
of the ops outside Mosaic kernels (ms at ``--clock-ghz``), the largest by op name, and the
splash blocks of the cached self-attention; the model FLOPs a chunk
(``causal_stream.chunk_flops``: as attended, and as the kernels' padded blocks compute them)
and the predicted seconds a chunk: XLA's estimate outside the kernels plus the attention
kernels' padded FLOPs at ``--kernel-tflops`` (measured splash rates, ``docs/tpu_v5e.md``).
A prediction: the chip measures (``benchmarks/causal_stream.py``). ``--layers``: fewer
layers compile faster (the layer loop is one body; scale its per-layer numbers).
``--quantize int8 [--quantize-activations]``: the block linears 8-bit, as
``model.quantize=int8 [model.quantize_activations=true]`` (native int8 x int8 dots on a v5e).

    python benchmarks/causal_chunk_plan.py [--layers 30] [--target tpu-v5e-1] [--hlo FILE]
        [--context-chunks 3] [--steps 4] [--quantize none] [--quantize-activations]
"""

from __future__ import annotations

import argparse
import json
import os
import re


def cycle_estimates(text: str, clock_hz: float) -> dict:
    """XLA:TPU's ``estimated_cycles`` of the compiled ops (loop trips counted; Mosaic kernels
    carry none) as ms: the total and per op name (the last part of its ``op_name``)."""
    from ditax.plan.audit import _Program
    from ditax.plan.hlo import multiplicities

    prog = _Program(text)
    mult, _, _ = multiplicities(prog.comps, [prog.entry], prog.graph)
    per: dict[str, float] = {}
    for name, m in mult.items():
        if not m or name in prog.fused:
            continue
        for ins in prog.comps[name].instrs.values():
            c = re.search(r'estimated_cycles":"(\d+)"', ins.attrs)
            if c:
                meta = re.search(r'op_name="([^"]+)"', ins.attrs)
                key = meta.group(1).split("/")[-1] if meta else ins.opcode
                per[key] = per.get(key, 0.0) + m * int(c.group(1)) / clock_hz * 1e3
    top = dict(sorted(per.items(), key=lambda kv: -kv[1])[:8])
    return {"total_ms": round(sum(per.values()), 3),
            "top_ms": {k: round(v, 3) for k, v in top.items()}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="tpu-v5e-1")
    p.add_argument("--size", default="1.3b")
    p.add_argument("--layers", type=int, default=None, help="default: the size's")
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--chunk", type=int, default=3)
    p.add_argument("--context-chunks", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--param-dtype", default="float32",
                   help="the weights' storage dtype (bfloat16: a bf16 student)")
    p.add_argument("--quantize", choices=("none", "int8", "fp8"), default="none")
    p.add_argument("--quantize-activations", action="store_true")
    p.add_argument("--kernel-tflops", default="125,166,177",
                   help="attention kernel rates to predict at (TFLOP/s, comma list)")
    p.add_argument("--clock-ghz", type=float, default=1.5, help="for XLA's cycle estimates")
    p.add_argument("--hlo", default=None, help="also write the compiled HLO text here")
    a = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")      # this host's backend; the target is TPU

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P

    from causal_stream import SIZES, chunk_flops
    from ditax.attention.tuning import splash_blocks
    from ditax.config import AttentionConfig, ModelConfig
    from ditax.front.run import run_context
    from ditax.models.wan import kv_cache
    from ditax.intmath import round_up
    from ditax.models.wan.build import abstract_model, param_shardings
    from ditax.nn.quant import quantize_module
    from ditax.parallel import make_mesh
    from ditax.pipelines.causal import _chunk_program
    from ditax.pipelines.sampling import set_timesteps
    from ditax.plan.measure import compile_timed, measure
    from ditax.plan.targets import parse_target, topology_devices
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler

    target = parse_target(a.target)
    devices = topology_devices(target)[:1]
    mesh = make_mesh({"data": 1}, devices)
    acfg = AttentionConfig(backend="auto")
    size = dict(SIZES[a.size], **({} if a.layers is None else {"num_layers": a.layers}))
    cfg = ModelConfig(dtype=a.dtype, param_dtype=a.param_dtype, quantize=a.quantize,
                      quantize_activations=a.quantize_activations, **size)
    y, x = a.height // 8, a.width // 8
    rep = NamedSharding(mesh, P())
    spec = lambda a_: jax.ShapeDtypeStruct(np.shape(a_), jnp.asarray(a_).dtype,  # noqa: E731
                                           sharding=rep)
    with run_context(acfg, mesh, compile_cache="none", say=lambda *_: None):
        model = quantize_module(abstract_model(cfg, acfg, mesh), a.quantize,
                                a.quantize_activations, devices)
        gdef, state = nnx.split(model)
        state = jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
                             state, param_shardings(state, cfg, mesh))
        kv = jax.eval_shape(lambda: kv_cache.init_cache(model, 1, (a.chunk, y, x),
                                                        a.context_chunks))
        sched = FlowMatchEulerScheduler(shift=5.0)
        sigmas = tuple(float(s) for s in np.linspace(1.0, 0.0, a.steps + 1)[:-1])
        chunk = (1, cfg.in_channels, a.chunk, y, x)
        st = jax.tree.map(spec, set_timesteps(sched, a.steps, chunk, sigmas))
        lowered = _chunk_program.lower(
            gdef, kv_cache, sched, False, None, state, st,
            jax.ShapeDtypeStruct(chunk, jnp.float32, sharding=rep),
            jax.ShapeDtypeStruct((1, a.text_tokens, cfg.text_dim), jnp.dtype(a.dtype),
                                 sharding=rep),
            jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rep), kv),
            jax.ShapeDtypeStruct((), jnp.float32, sharding=rep))
        compiled, secs = compile_timed(lowered)
    out = measure(compiled, compile_s=secs, model_flops=0.0, num_layers=cfg.num_layers,
                  chip=target.chip, hlo_path=a.hlo)
    out.pop("loops", None)
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    _, _, lp = kv_cache.chunk_tokens(model, (a.chunk, y, x))
    keys = kv.k.shape[3 if model.attention_plan.self_attn.reads_head_major else 2]
    blocks = splash_blocks(lp, keys, devices[0].device_kind, {})
    est = cycle_estimates(compiled.as_text(), a.clock_ghz * 1e9)
    flops = chunk_flops(cfg, lp, (a.context_chunks + 2) * lp, a.steps, a.text_tokens)
    padded = chunk_flops(cfg, round_up(lp, blocks["block_q"]), keys, a.steps, a.text_tokens)
    kernel = padded["self_attention"] + flops["cross_attention"]   # cross: tiny, as attended
    mode = ("" if a.quantize == "none" else
            f"_{a.quantize}{'wa' if a.quantize_activations else ''}")
    kernel_s = {r: kernel / (float(r) * 1e12) for r in a.kernel_tflops.split(",")}
    row = {"bench": "causal_chunk_plan", "target": a.target, "layers": cfg.num_layers,
           "case": f"wan{a.size}_{a.height}x{a.width}_chunk{a.chunk}_ctx{a.context_chunks}"
                   f"_steps{a.steps}_{a.dtype}{mode}"
                   + ("" if a.param_dtype == "float32" else f"_{a.param_dtype}_weights"),
           "flops_per_chunk": flops, "kernel_flops_padded": kernel,
           "predicted_chunk_s": {r: round(est["total_ms"] / 1e3 + s, 3)
                                 for r, s in kernel_s.items()},
           "chunk_tokens": lp, "cache_keys": keys,
           "cache_bytes": 2 * kv.k.size * jnp.dtype(kv.k.dtype).itemsize,
           "self_attention": model.attention_plan.self_attn.backend,
           "splash_blocks": blocks,
           "cost_analysis": {k: ca.get(k) for k in ("flops", "bytes accessed")},
           "xla_estimates": est, **out}
    print(json.dumps(row, default=str), flush=True)


if __name__ == "__main__":
    from ditax.tpu_env import raise_scoped_vmem

    raise_scoped_vmem()    # as causal_stream.py and every ditax command: splash's large tiles
    main()
