"""Wan 2.1 VAE decoder convolutions: the :mod:`ditax.models.vae.wan.conv_tpu` kernel with and
without tap packing (``pack=``, and ``cols=`` where it saves output passes:
:mod:`~ditax.models.vae.wan.conv_tpu_pack`), three ways; variants ``padded``, ``packed``,
``cols`` and session 62's forms (:func:`applied`).

1. ``--flops``: the 480p x 81 decode's convolution work per stage (the useful FLOPs of its
   real channels; the MXU work of the padded kernel, 128 x 128 passes; the packed kernel's),
   analytic, no compile.
2. ``--llo`` (default): no chip, a static schedule. Each case (the decoder's real shapes: 96
   channels at 480x832, 192 at 240x416, 384 at 120x208 for reference; the epilogues the
   decoder fuses there) compiled by libtpu for a v5e (deviceless), the kernel's final VLIW
   bundles dumped, one JSON line each: a grid step's static length (each bundle weighted by
   the trips of the loops around it: sub-blocks, and the unpacked kernel's tap loop), per
   frame (times the row blocks), the ratio to the padded kernel. Static: DMA waits and stalls
   are not in it. ~1 min a case on 2 cores.

     PYTHONPATH=src python benchmarks/vae_conv_pack.py [--llo] [--cases res96,res192]

3. ``--chip``: first the probes of the pieces packing builds on
   (:mod:`ditax.models.vae.wan.conv_tpu_probe`: ``pltpu.roll`` against ``jnp.roll``, the
   packed operand's assembly at each decoder shape, the column extraction; one
   ``vae_conv_probe`` line each, ``ok`` when exact), then the same cases timed on this
   machine's TPU (median of ``--repeats`` after a compile and a warm-up; 4 frames each), one
   JSON line each with the ratio to the padded kernel, the largest difference of the outputs
   from its, and where the differences lie (``bad_rows`` / ``bad_cols`` / ``bad_channels``);
   ``packed_bf16asm`` assembles the packed operand in bf16 as session 62's kernel did,
   ``packed_unaligned`` (the 104-pixel cases) takes 520-pixel products as it did,
   ``packed_s62`` both (today's ``packed``: float32 assembly, aligned products). Session 62's
   chip decode differed packed vs fast by 0.969: a line with ``"ok": false`` names the
   kernel (~1 min for the probes, ~30 s a case):

     PYTHONPATH=$PWD/src:$PYTHONPATH python3 benchmarks/vae_conv_pack.py --chip --repeats 3

   ``--probes`` (no chip) only compiles the probes for a v5e, deviceless (~10 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

#: name → (Y, X, padded C, C_out (padded), kt, real C (``pack``), epilogue): the decoder's
#: convolutions
CASES = {
    "in16": (60, 104, 128, 384, 3, 16, None),            # conv_in: the latent's 16 of 128
    "res384_104": (60, 104, 384, 384, 3, 384, "act"),   # 104-pixel rows: odd 520-pixel products
    "up384_104": (60, 104, 384, 1024, 1, 384, "phases"),  # upsample3d's conv: 384 → 192
    "res96": (480, 832, 128, 128, 3, 96, "act"),         # resnet conv1 (norm + SiLU fused)
    "res96_residual": (480, 832, 128, 128, 3, 96, "residual"),   # resnet conv2
    "out96": (480, 832, 128, 3, 3, 96, None),             # conv_out: 3 channels (narrow)
    "res192": (240, 416, 256, 256, 3, 192, "act"),
    "res192_residual": (240, 416, 256, 256, 3, 192, "residual"),
    "up192": (240, 416, 256, 512, 1, 192, "phases"),     # upsample2d: 192 → 96 at 480x832
    "res384": (120, 208, 384, 384, 3, 384, "act"),   # nothing padded: one contraction only
    "up384": (120, 208, 384, 1024, 1, 384, "phases"),    # upsample3d's conv: 384 → 192
}
FRAMES = 4
BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+|\d+)\s+(LB|LH|LE|PB|PF|CT)?\s*:\s*(>*)\s*\{(.*)\}")
OPS = ("vmatmul", "vld", "vst", "vrot", "vsel")


def flops_rows() -> list[dict]:
    """Mode 1: Wan 2.1's decoder at 480x832 x 81 frames (21 latent frames), per stage: the
    convolutions' useful FLOPs, and the MXU work (128 x 128 passes) of the kernel padded and
    packed (``cols=`` where it saves passes). Upsampling convolutions count at their input
    (4 phases, 9 taps each), conv_out as the kernel's narrow form (three column taps in one
    128-lane product)."""
    from ditax.models.vae.wan.conv_tpu_pack import passes, saves_columns

    lanes = lambda c: -(-c // 128) * 128  # noqa: E731

    def conv(stage, yxf, cin, cout, kt=3, k=3, phases=False):
        px = yxf[0] * yxf[1] * yxf[2]
        n = 4 if phases else 1
        useful = 2 * kt * k * k * cin * cout * n * px
        cols, width = (1, 128) if cout < 43 else (k, n * lanes(cout))   # narrow: conv_out
        padded = 2 * kt * k * cols * lanes(cin) * width * px
        packed = 2 * cols * 128 * passes(cin, kt, True) * width * px if k == 3 else padded
        if k == 3 and not phases and cols == 3 and saves_columns(cout):   # cols=: one product
            packed = 2 * 128 * passes(cin, kt, True) * lanes(3 * cout) * px
        return stage, useful, padded, min(padded, packed)

    s0, s1, s2, s3 = (60, 104, 21), (120, 208, 41), (240, 416, 81), (480, 832, 81)
    convs = ([conv("60x104 384", s0, 16, 384)] + [conv("60x104 384", s0, 384, 384)] * 10
             + [conv("60x104 384", s0, 384, 768, k=1), conv("60x104 384", (60, 104, 41), 384,
                                                            192, kt=1, phases=True)]
             + [conv("120x208 384", s1, 192, 384)] + [conv("120x208 384", s1, 384, 384)] * 5
             + [conv("120x208 384", s1, 192, 384, kt=1, k=1),
                conv("120x208 384", s1, 384, 768, k=1),
                conv("120x208 384", (120, 208, 81), 384, 192, kt=1, phases=True)]
             + [conv("240x416 192", s2, 192, 192)] * 6
             + [conv("240x416 192", s2, 192, 96, kt=1, phases=True)]
             + [conv("480x832 96", s3, 96, 96)] * 6 + [conv("480x832 96", s3, 96, 3)])
    rows = {}
    for stage, *work in convs:
        r = rows.setdefault(stage, [0, 0, 0])
        rows[stage] = [u + v for u, v in zip(r, work)]
    total = [sum(r[i] for r in rows.values()) for i in range(3)]
    return [{"bench": "vae_conv_flops", "case": f"480x832x81 {name}", "metric": "flops",
             "value": r[0], "unit": "flop", "padded_mxu": r[1], "packed_mxu": r[2],
             "padded_share": round(r[1] / total[1], 3), "packed_ratio": round(r[2] / r[1], 3)}
            for name, r in list(rows.items()) + [("total", total)]]


@contextlib.contextmanager
def applied(variant: str):
    """The module settings a variant traces under: ``packed_bf16asm`` assembles the packed
    operand in bf16 (rolls, selects and stores at odd 128-lane offsets), ``packed_unaligned``
    lets products take any number of pixels (520 at the 104-pixel latent rows),
    ``packed_s62`` both: session 62's packed kernel. ``packed`` / ``cols``: today's
    (float32 assembly, products of a multiple of 16 pixels)."""
    from ditax.models.vae.wan import conv_tpu, conv_tpu_pack

    bf16asm, unaligned = (conv_tpu_pack, "ASSEMBLY_DTYPE", None), (conv_tpu, "_ROW_ALIGN", 1)
    sets = {"packed_bf16asm": [bf16asm], "packed_unaligned": [unaligned],
            "packed_s62": [bf16asm, unaligned]}.get(variant, [])
    saved = [(m, name, getattr(m, name)) for m, name, _ in sets]
    for m, name, v in sets:
        setattr(m, name, v)
    try:
        yield
    finally:
        for m, name, v in saved:
            setattr(m, name, v)


def variants(case: str) -> list[str]:
    """``padded``, ``packed`` (``pack=``), ``packed_bf16asm`` (:func:`applied`), where the
    packed products' pixels would not be a multiple of 16 without ``conv_tpu._ROW_ALIGN``
    ``packed_unaligned`` and ``packed_s62``, and ``cols`` (``pack=`` and ``cols=``: the
    column taps side by side in the output lanes) where that saves output passes (192)."""
    from ditax.models.vae.wan import conv_tpu
    from ditax.models.vae.wan.conv_tpu_pack import saves_columns

    y, x, c, cout, _, real, epi = CASES[case]
    cols = epi != "phases" and cout == c and saves_columns(real)
    ty = conv_tpu.block_rows(y, x, max(c, -(-cout // 128) * 128))
    with applied("packed_unaligned"):
        odd = conv_tpu.sub_rows(ty, x, True) * x % 16 != 0
    return (["padded", "packed", "packed_bf16asm"]
            + (["packed_unaligned", "packed_s62"] if odd else []) + (["cols"] if cols else []))


def _kernel_call(case: str, variant: str, interpret: bool = False):
    """(fn, args) of one case: the kernel on random bf16 inputs (real channels only; the
    outputs' padded channels with zero weights, as the decoder's)."""
    import jax
    import jax.numpy as jnp

    from ditax.models.vae.wan import conv_tpu

    y, x, c, cout, kt, real, epi = CASES[case]
    k = jax.random.split(jax.random.key(0), 6)
    keep = (jnp.arange(c) < real).astype(jnp.bfloat16)
    xs = jax.random.normal(k[0], (1, FRAMES, y, x, c), jnp.bfloat16) * keep
    cache = jax.random.normal(k[1], (1, 2, y, x, c), jnp.bfloat16) * keep if kt == 3 else None
    out = (jnp.arange(cout) < real if cout == c else jnp.ones(cout)).astype(jnp.bfloat16)
    w = (jax.random.normal(k[2], (kt, 3, 3, c, cout), jnp.float32) / (9 * kt * c) ** 0.5
         ).astype(jnp.bfloat16) * out
    b = jax.random.normal(k[3], (cout,), jnp.bfloat16) * out
    extra = {"act": (1 + 0.1 * jax.random.normal(k[4], (cout,), jnp.bfloat16)) * out,
             "residual": jax.random.normal(k[5], (1, FRAMES, y, x, cout), jnp.bfloat16) * out,
             "phases": None, None: None}[epi]
    opts = dict(pack=None if variant == "padded" else real,
                cols=real if variant == "cols" else None, phases=epi == "phases",
                interpret=interpret)
    def fn(xs, cache, w, b, extra):
        kw = {"act": {"act": (extra, cout ** 0.5)}, "residual": {"residual": extra}}.get(epi, {})
        with applied(variant):    # read while this traces
            return conv_tpu.causal_conv3x3(xs, cache, w, b, **kw, **opts)

    return jax.jit(fn), (xs, cache, w, b, extra)


def trips(case: str, variant: str) -> list[int]:
    """Trips of the kernel's loops inside a grid step, outermost first: sub-blocks, then
    (unpacked) the (time, row) taps; loops of one trip left out."""
    from ditax.models.vae.wan import conv_tpu

    y, x, c, cout, kt, _, _ = CASES[case]
    ty = conv_tpu.block_rows(y, x, max(c, -(-cout // 128) * 128))
    with applied(variant):
        sub = conv_tpu.sub_rows(ty, x, variant != "padded")
    loops = [ty // sub] if variant != "padded" else [ty // sub, 3 * kt]
    return [t for t in loops if t > 1]     # a loop of one trip is no loop in the LLO


def step_stats(path: str, loop_trips: list[int]) -> dict:
    """A grid step's static bundles: bundles at loop depth d (1: the grid loop's body)
    weighted by the trips of the loops at depths 2 .. d."""
    rows = []
    for line in open(path):
        m = BUNDLE.match(line)
        if m:
            rows.append((len(m.group(3)), m.group(4)))
    step = 0
    for depth, _ in rows:
        w = 1
        for t in loop_trips[:max(depth - 1, 0)]:
            w *= t
        step += w if depth >= 1 else 0
    ops = {o: sum(len(re.findall(rf"= {o}[.\s]", r[1])) for r in rows) for o in OPS}
    depths = {d: sum(1 for r in rows if r[0] == d) for d in sorted({r[0] for r in rows})}
    return {"value": step, "bundles": len(rows), "bundles_by_depth": depths, "ops": ops}


def llo_rows(a) -> None:
    """Mode 2: one child process a compile (libtpu reads the dump flags when it starts)."""
    for case in a.cases.split(","):
        base = None
        for variant in variants(case):
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, LIBTPU_INIT_ARGS=(
                    f"--xla_jf_dump_to={d} --xla_jf_dump_llo_text=true "
                    "--xla_jf_dump_llo_pass_label_regex=final_bundles"))
                t = time.perf_counter()
                r = subprocess.run([sys.executable, os.path.abspath(__file__), "--llo-one", case]
                                   + ["--variant", variant], env=env, capture_output=True,
                                   text=True)
                found = [f for f in os.listdir(d) if f.endswith("final_bundles.txt")
                         and "wan_vae_conv3x3" in f and "schedule-analysis" not in f]
                y, x, c, cout, kt, real, epi = CASES[case]
                row = {"bench": "vae_conv_llo", "case": f"{case} {y}x{x} C{real}->{cout} "
                       f"kt{kt} {epi or 'plain'}", "variant": variant,
                       "metric": "bundles_per_grid_step", "unit": "bundles",
                       "compile_s": round(time.perf_counter() - t, 1)}
                if r.returncode or not found:
                    row["error"] = (r.stderr.strip().splitlines() or ["no dump"])[-1][:300]
                else:
                    row.update(step_stats(os.path.join(d, found[0]), trips(case, variant)))
                    ty = int(r.stdout.split("ty=")[1].split()[0])
                    row["grid_steps_per_frame"] = y // ty
                    row["bundles_per_frame"] = row["value"] * (y // ty)
                    if base is None:
                        base = row["value"]
                    else:
                        row["baseline"], row["ratio"] = base, round(row["value"] / base, 3)
            print(json.dumps(row), flush=True)


def llo_one(a) -> None:
    """The child of ``--llo``: compile one case for a v5e (deviceless)."""
    import jax
    import numpy as np

    from ditax.models.vae.wan import conv_tpu
    from ditax.plan.targets import parse_target, topology_devices

    dev = topology_devices(parse_target("tpu-v5e-1"))[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    fn, args = _kernel_call(a.llo_one, a.variant)
    shapes = [None if v is None else jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rep)
              for v in args]
    fn.lower(*shapes).compile()
    y, x, c, cout = CASES[a.llo_one][:4]
    print(f"ty={conv_tpu.block_rows(y, x, max(c, -(-cout // 128) * 128))}")


def where_different(out, ref, tol: float) -> dict:
    """How ``out`` ``[B, F, Y, X, C]`` differs from ``ref``: the largest difference, the share
    of elements off by more than ``tol``, and (the first few of) the frames, rows, columns
    and channels where they lie, so that one chip run shows the pattern (a sub-block's
    rows, a lane range, a row's last pixels...)."""
    import numpy as np

    diff = np.abs(out - ref)
    bad = diff > tol
    row = {"max_abs_diff": float(diff.max()), "ref_max_abs": float(np.abs(ref).max()),
           "tol": tol, "bad_share": round(float(bad.mean()), 6)}
    if bad.any():
        for name, axis in (("frames", 1), ("rows", 2), ("cols", 3), ("channels", 4)):
            hit = np.flatnonzero(bad.any(axis=tuple(i for i in range(5) if i != axis)))
            row[f"bad_{name}"] = {"n": int(hit.size), "of": bad.shape[axis],
                                  "first": hit[:12].tolist()}
    return row


def probe_compile_rows() -> None:
    """``--probes``: no chip; each probe compiled by libtpu for a v5e (deviceless), one line
    each (``compiled`` or ``error``): what ``--chip`` will run compiles."""
    import jax
    import numpy as np

    from ditax.models.vae.wan import conv_tpu_probe
    from ditax.plan.targets import parse_target, topology_devices

    dev = topology_devices(parse_target("tpu-v5e-1"))[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    conv_tpu_probe.COMPILE_ONLY = lambda fn, args: fn.lower(*[
        jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rep) for v in args]).compile()
    for row in conv_tpu_probe.all_rows():
        print(json.dumps({"bench": "vae_conv_probe", "device_kind": "v5e deviceless", **row}),
              flush=True)


def chip_rows(a) -> None:
    """Mode 3: on this machine's chip, first the probes (:mod:`ditax.models.vae.wan.
    conv_tpu_probe`: pltpu.roll, the packed operand's assembly, the column extraction, each
    against numpy), then each case's variants timed, every packed one with its outputs'
    difference from the padded kernel's (the fast path's, which equals the plain decode on
    the chip) and where the differences lie. A case that fails prints its error and the run
    goes on."""
    import jax
    import numpy as np

    from bench_lines import emit
    from tpu_sweep import timed

    if jax.devices()[0].platform != "tpu":
        raise SystemExit(f"--chip times the kernel on a TPU; this machine has "
                         f"{jax.devices()[0].platform} (use --llo here)")
    kind = jax.devices()[0].device_kind
    if not a.no_probes:
        from ditax.models.vae.wan import conv_tpu_probe

        for row in conv_tpu_probe.all_rows():
            emit({"bench": "vae_conv_probe", "device_kind": kind, **row,
                  "ok": row.get("max_abs_diff") == 0.0 and not row.get("nan")})
    keep = a.variants.split(",") if a.variants else None
    for case in a.cases.split(","):
        base = out0 = None
        for variant in variants(case):
            if keep and variant != "padded" and variant not in keep:
                continue
            row = {"bench": "vae_conv_chip", "case": case, "variant": variant, "metric": "conv",
                   "unit": "s", "frames": FRAMES, "device_kind": kind}
            try:
                fn, args = _kernel_call(case, variant)
                compile_s, median = timed(fn, args, a.repeats)
                out = np.asarray(fn(*args), np.float32)
            except Exception as e:   # one case's failure names itself; the others still run
                emit({**row, "error": f"{type(e).__name__}: {str(e).strip()[:300]}"})
                continue
            row.update(value=median, compile_s=round(compile_s, 2))
            if base is None:
                base, out0 = row["value"], out
            elif out0 is not None:
                row["baseline"], row["ratio"] = base, round(row["value"] / base, 3)
                row.update(where_different(out, out0, 0.05 * float(np.abs(out0).max())))
                row["ok"] = row["max_abs_diff"] <= 2 ** -6 * row["ref_max_abs"]
            emit(row)


def main(argv=None) -> None:
    global FRAMES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llo", action="store_true", help="static bundles, deviceless (default)")
    ap.add_argument("--flops", action="store_true", help="analytic FLOPs per decoder stage")
    ap.add_argument("--chip", action="store_true", help="time the cases on this chip")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--variants", default="",
                    help="--chip: only these (comma-separated; padded always runs)")
    ap.add_argument("--no-probes", action="store_true", help="--chip: skip the probes")
    ap.add_argument("--frames", type=int, default=FRAMES,
                    help="--chip: frames a call (the 480p decode: 1 at the latent level and "
                         "in the first chunk, 2 at 120x208, 4 above)")
    ap.add_argument("--probes", action="store_true",
                    help="compile the probes for a v5e, deviceless (--chip runs them)")
    ap.add_argument("--llo-one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="padded", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    FRAMES = a.frames
    if a.llo_one:
        llo_one(a)
    elif a.flops:
        for row in flops_rows():
            print(json.dumps(row))
    elif a.chip:
        chip_rows(a)
    elif a.probes:
        probe_compile_rows()
    else:
        llo_rows(a)


if __name__ == "__main__":
    main()
