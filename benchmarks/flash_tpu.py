"""ditax's flash kernel on a TPU, two ways.

1. Deviceless TPU v6e compile of attention forward+backward (issue 11 item 4): ditax's
   ``flash`` (Pallas forward + Pallas dq / dk-dv kernels) next to ``blockwise`` (the jnp
   recompute backward flash used before), on one v6e device. One JSON line per case: compile
   time, per-device memory (memory_analysis), relayout copies, Mosaic kernels, FLOPs.

     PYTHONPATH=src python benchmarks/flash_tpu.py [--L 8192] [--N 8] [--K 128] [--block 512]

   Needs libtpu (``pip install "jax[tpu]==<jax version>"``). Kept out of CI: each compile
   takes seconds to minutes on 2 cores.

2. ``--chip``: on the lent chip (issue 54 item 2), JAX's splash kernel against each block-loop
   variant of flash's forward (:mod:`ditax.attention.kernels.flash_variant`) at Wan 2.1 1.3B
   480p's self-attention shape (1 x 32,760 tokens x 12 heads x 128, bf16, the table's
   tiles), forward; then forward + backward for splash, the plain kernel and the fastest
   forward variant; then the plain kernel and the fastest variant on head-major inputs
   (contiguous tiles instead of the packed layout's strided ones: the DMA's share). Each case compiled and run once, then timed ``--repeats`` times (median);
   one JSON line per case (``bench``, ``case``, ``metric``, ``value``, ``unit``, ``variant``,
   ``direction``, ``baseline`` (splash's time), ``ratio``, and the forward's largest
   difference from the plain kernel's output); ``--budget-s`` stops starting cases once
   spent. Off a TPU it runs the same cases in interpret mode at a tiny shape (a check that
   the script works, not a measurement).

     PYTHONPATH=$PWD/src:$PYTHONPATH python3 benchmarks/flash_tpu.py --chip \
         --out $OUT/flash.jsonl --budget-s 150

   (jax and ditax's sources only: no ``tpu_setup.sh`` needed; the chip machine's
   PYTHONPATH carries its JAX, so keep it.)

3. ``--llo``: no chip, a static schedule: each of those forward kernels compiled by libtpu for
   a v5e (deviceless) with its final VLIW bundles dumped; one JSON line per kernel with the
   bundles of a grid step (a Mosaic kernel has no cycle estimate in XLA's cost analysis; its
   static schedule is the nearest thing, stalls excluded). ~1-5 min on 2 cores.

     PYTHONPATH=src python benchmarks/flash_tpu.py --llo [--variants plain,unroll]
"""

import argparse
import json
import os
import re
import statistics
import sys
import time
import bench_lines

import numpy as np

BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


def copies(hlo: str) -> tuple[int, int]:
    """(number, bytes) of ``copy`` ops in optimised HLO text."""
    n = b = 0
    for m in re.finditer(r"= (\w+)\[([\d,]*)\]\{[^}]*\} copy\(", hlo):
        n += 1
        b += BYTES.get(m.group(1), 4) * int(np.prod([int(x) for x in m.group(2).split(",") if x]
                                                    or [1]))
    return n, b


def compile_rows(a) -> None:
    """Mode 1: the deviceless v6e compiles (module docstring)."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from ditax import target_platform
    from ditax.attention import attend

    topo = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4")
    mesh = Mesh(np.array(topo.devices[:1]), ("x",))
    x = jax.ShapeDtypeStruct((1, a.L, a.N, a.K), jnp.bfloat16, sharding=NamedSharding(mesh, P()))

    for backend in ("flash", "blockwise"):
        def grads(q, k, v, backend=backend):
            def loss(q, k, v):
                o = attend(q, k, v, backend=backend, block_q=a.block, block_kv=a.block)
                return jnp.sum(o.astype(jnp.float32))
            return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

        t = time.perf_counter()
        with target_platform("tpu"):
            c = jax.jit(grads).lower(x, x, x).compile()
        hlo, ma = c.as_text(), c.memory_analysis()
        ca = c.cost_analysis()
        ca = ca[0] if isinstance(ca, list) else ca
        n, b = copies(hlo)
        print(json.dumps({
            "bench": "flash_tpu", "case": f"fwd_bwd L={a.L} N={a.N} K={a.K} block={a.block}",
            "backend": backend, "chip": "v6e", "compile_s": round(time.perf_counter() - t, 1),
            "temp_bytes": ma.temp_size_in_bytes, "argument_bytes": ma.argument_size_in_bytes,
            "copy_ops": n, "copy_bytes": b,
            "tpu_custom_calls": hlo.count('custom_call_target="tpu_custom_call"'),
            "flops": ca.get("flops")}), flush=True)


#: the forward variants timed by --chip and --llo, in order: after the plain kernel the
#: shortest static schedules first (--llo, docs/tpu_v5e.md "Flash kernel vs splash"), as the
#: budget cuts the last ones
CHIP_VARIANTS = ("plain", "all", "unroll+lanes+pv_f32", "unroll+lanes", "unroll+lanes+prescale",
                 "unroll", "pv_f32", "prescale", "lanes")
WAN = (1, 32760, 12, 128)          # Wan 2.1 1.3B, 480x832x81: 21 x 30 x 52 tokens
TINY = (1, 200, 2, 128)            # off a TPU: interpret mode, partial blocks


def chip_rows(a) -> None:
    """Mode 2: splash against flash's forward variants on the chip (module docstring)."""
    from ditax.tpu_env import raise_scoped_vmem

    raise_scoped_vmem()     # as tpu_chip.py: splash's table tiles need the raised limit
    import jax
    import jax.numpy as jnp

    from ditax.attention import attend
    from ditax.attention.flash import Variant, flash_attention_tuned, flash_tune

    try:                                    # a typo fails here, in one line, before a compile
        variants = [Variant.parse(v) for v in a.variants.split(",")]
    except ValueError as e:
        raise SystemExit(f"flash_tpu.py --variants: {e}") from None
    on_tpu = jax.default_backend() == "tpu"
    shape = tuple(int(x) for x in a.shape.split(",")) if a.shape else (WAN if on_tpu else TINY)
    blocks = {} if on_tpu else dict(block_q=64, block_kv=128, block_kv_compute=64)
    B, L, N, K = shape
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(x, shape, jnp.bfloat16) for x in keys)
    bq, bkv, tune = flash_tune(q, k, interpret=not on_tpu, **blocks)
    fwd_flops = 4.0 * B * N * L * L * K
    kind = jax.devices()[0].device_kind
    deadline = time.time() + a.budget_s
    base = {"bench": "flash_variants", "device_kind": kind, "jax": jax.__version__,
            "shape": list(shape), "interpret": not on_tpu,
            "blocks": [bq, bkv, tune.block_kv_compute, tune.block_q_bwd, tune.block_kv_bwd]}
    splash_s, plain_out = {}, None

    def emit(row):
        bench_lines.emit({**base, **row}, a.out)

    def attention(variant, head_major):
        if variant is None:
            return lambda q, k, v: attend(q, k, v, backend="splash", interpret=not on_tpu)
        t = tune._replace(variant=variant)
        return lambda q, k, v: flash_attention_tuned(q, k, v, t, block_q=bq, block_kv=bkv,
                                                     interpret=not on_tpu,
                                                     head_major=head_major)

    def case(variant, direction, head_major=False):
        name = "splash" if variant is None else f"flash variant={variant.name}"
        layout = "head_major" if head_major else "packed" if variant is not None else None
        label = f"attention {direction} L={L} N={N} K={K} {name}" + (
            " head-major input" if head_major else "")
        row = {"case": label, "variant": None if variant is None else variant.name,
               "direction": direction, "layout": layout}
        if time.time() > deadline:
            return emit({**row, "skipped": "budget"})
        f = attention(variant, head_major)
        args = heads if head_major else (q, k, v)
        if direction == "fwd+bwd":
            def g(q, k, v, f=f):
                loss = lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32))  # noqa: E731
                return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
            fn, flops = g, 3.5 * fwd_flops
        else:
            fn, flops = f, fwd_flops
        try:
            jf = jax.jit(fn)
            t0 = time.perf_counter()
            out = jax.block_until_ready(jf(*args))
            first = time.perf_counter() - t0
            times = []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(jf(*args))
                times.append(time.perf_counter() - t0)
        except Exception as e:        # one failed variant must not end the run
            return emit({**row, "error": str(e).splitlines()[0][:300]})
        med = statistics.median(times)
        row.update(metric="time", value=med, unit="s", runs=times,
                   compile_plus_first_s=round(first, 2), flops=flops,
                   tflops=round(flops / med / 1e12, 1), mfu=round(flops / med / 197e12, 3))
        if variant is None:
            splash_s[direction] = med
        elif direction in splash_s:
            row.update(baseline=splash_s[direction], ratio=round(med / splash_s[direction], 4))
        if direction == "fwd" and variant is not None:
            nonlocal plain_out
            o = np.asarray((jnp.swapaxes(out, 1, 2) if head_major else out).astype(jnp.float32))
            if variant == Variant() and not head_major:
                plain_out = o
            elif plain_out is not None:
                row["max_abs_diff_vs_plain"] = float(np.max(np.abs(o - plain_out)))
        emit(row)
        return row

    case(None, "fwd")
    fwd = [case(vt, "fwd") for vt in variants]
    timed = [r for r in fwd if r and "value" in r and r["variant"] != "plain"]
    best = min(timed, key=lambda r: r["value"]) if timed else None
    case(None, "fwd+bwd")
    case(Variant(), "fwd+bwd")
    if best is not None:
        case(Variant.parse(best["variant"]), "fwd+bwd")
    # the same kernels on head-major [B, N, L, K] inputs (transposed before the timing):
    # contiguous (block, K) tiles instead of the packed layout's strided ones (DMA's share)
    heads = tuple(jax.block_until_ready(jnp.swapaxes(x, 1, 2)) for x in (q, k, v))
    case(Variant(), "fwd", head_major=True)
    if best is not None:
        case(Variant.parse(best["variant"]), "fwd", head_major=True)


def llo_rows(a) -> None:
    """Mode 3 (``--llo``): the static schedule of each forward kernel — splash's and each flash
    variant's — as libtpu compiles it for a v5e without one: the kernel's final VLIW bundles
    (``--xla_jf_dump_to``, one child process a kernel: the flag is read when the TPU backend
    starts), its inner loops' bundles, and a grid step's bundles (the straight-line code plus
    each inner loop times its trips; at a length of whole key blocks there is one path, so
    this is a step's static length, init / finish regions included). Static: stalls (DMA
    waits, interlocks) are not in it; the chip measures those (``--chip``)."""
    import subprocess
    import tempfile

    shape = a.shape or "1,32768,12,128"
    for name in ["splash"] + a.variants.split(","):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, LIBTPU_INIT_ARGS=(
                f"--xla_tpu_scoped_vmem_limit_kib=98304 --xla_jf_dump_to={d} "
                f"--xla_jf_dump_llo_text=true --xla_jf_dump_llo_pass_label_regex=final_bundles"))
            t = time.perf_counter()
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--llo-one", name,
                                "--shape", shape], env=env, capture_output=True, text=True)
            found = [f for f in os.listdir(d) if f.endswith("final_bundles.txt")
                     and ("splash_mha_fwd" in f or "ditax_flash_fwd" in f)
                     and "schedule-analysis" not in f]
            row = {"bench": "flash_llo", "case": f"forward {shape} {name}", "variant": name,
                   "compile_s": round(time.perf_counter() - t, 1)}
            if r.returncode or not found:
                row["error"] = (r.stderr.strip().splitlines() or ["no kernel dump"])[-1][:300]
            else:
                row.update(bundle_stats(os.path.join(d, found[0]), r.stdout))
            print(json.dumps(row), flush=True)


BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+)\s+(LB|LH|LE|PB|PF|CT)?\s*:\s*(>*)\s*\{(.*)\}")
OPS = ("vld", "vst", "vmatmul", "vpack", "vperm", "vmul", "vpow2")


def bundle_stats(path: str, child_out: str) -> dict:
    """Bundles of one kernel's final LLO: total, each inner (depth 2) loop body, static op
    counts (a loop body counted once), and a grid step's static length (``trips`` from the
    child: block_kv / compute block)."""
    rows = []
    for line in open(path):
        m = BUNDLE.match(line)
        if m:
            rows.append((m.group(2), len(m.group(3)), m.group(4)))
    loops = []
    for i, (mark, depth, _) in enumerate(rows):
        if mark == "LB" and depth == 2:
            n = 0
            while i + n < len(rows) and rows[i + n][1] >= depth:
                n += 1
            loops.append(n)
    ops = {o: sum(len(re.findall(rf"= {o}[.\s]", r[2])) for r in rows) for o in OPS}
    trips = int(child_out.split("trips=")[1].split()[0]) if "trips=" in child_out else 1
    step = len(rows) - sum(loops) + trips * sum(loops)
    return {"metric": "bundles_per_grid_step", "value": step, "unit": "bundles",
            "bundles": len(rows), "loop_bundles": loops, "trips": trips, "ops": ops}


def llo_one(a) -> None:
    """The child of ``--llo``: compile one forward for a v5e (deviceless)."""
    import jax
    import jax.numpy as jnp

    from ditax.attention import attend
    from ditax.attention.flash import Variant, flash_attention_tuned, flash_tune
    from ditax.parallel.platform import target_platform
    from ditax.plan.targets import parse_target, topology_devices

    dev = topology_devices(parse_target("tpu-v5e-1"))[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    x = jax.ShapeDtypeStruct(tuple(int(v) for v in a.shape.split(",")), jnp.bfloat16,
                             sharding=rep)
    with target_platform("tpu", device_kind=dev.device_kind):
        bq, bkv, tune = flash_tune(x, x, interpret=False)
        if a.llo_one == "splash":
            fn = lambda q, k, v: attend(q, k, v, backend="splash")  # noqa: E731
        else:
            t = tune._replace(variant=Variant.parse(a.llo_one))
            fn = lambda q, k, v: flash_attention_tuned(q, k, v, t, block_q=bq,  # noqa: E731
                                                       block_kv=bkv, interpret=False)
        jax.jit(fn).lower(x, x, x).compile()
    unrolled = a.llo_one == "splash" or Variant.parse(a.llo_one).unroll
    print(f"trips={1 if unrolled else bkv // (tune.block_kv_compute or bkv)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--L", type=int, default=8192)
    ap.add_argument("--N", type=int, default=8)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--chip", action="store_true",
                    help="time splash against flash's forward variants on this machine's chip")
    ap.add_argument("--variants", default=",".join(CHIP_VARIANTS),
                    help="--chip: the flash variants, comma-separated (flags joined by +)")
    ap.add_argument("--shape", default=None, help="--chip: B,L,N,K (default: Wan 1.3B 480p's "
                                                  "on a TPU, a tiny one in interpret mode)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--out", default=None, help="--chip: also append the rows to this file")
    ap.add_argument("--llo", action="store_true",
                    help="static VLIW bundles of splash's and each variant's forward kernel, "
                         "compiled for a v5e without one (default shape 1,32768,12,128)")
    ap.add_argument("--llo-one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    if a.llo_one:
        llo_one(a)
    elif a.llo:
        llo_rows(a)
    else:
        chip_rows(a) if a.chip else compile_rows(a)


if __name__ == "__main__":
    main()
