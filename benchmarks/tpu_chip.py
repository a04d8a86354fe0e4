"""The chip's table: ditax measured on one real TPU chip, written as ``docs/tpu_v5e.jsonl``
rows (ditax bench's ``bench``, ``case``, ``metric``, ``value``, ``unit`` plus ``flops``,
``mfu``, ``peak_hbm_bytes``, ``device_kind``, ``jax``, ``commit`` and the settings), and a
markdown table of them for ``docs/tpu_v5e.md`` (:func:`table`, runnable here on a fetched
jsonl).

On the lent chip (one call; DEVELOPERS.md "The chip"):

    source benchmarks/tpu_setup.sh
    python benchmarks/tpu_chip.py --out $OUT/tpu_v5e.jsonl --budget-s 480 [--part ...]

then here: ``python benchmarks/tpu_chip.py --table docs/tpu_v5e.jsonl`` prints the table.

Parts (run in the order given; ``--budget-s`` stops starting new cases once spent, each case
prints its row as it finishes): ``forward`` (the families' transformers at their standard
sizes, random weights, ``ditax bench``'s forward; ``wan480`` its first case alone),
``attention`` (each kernel alone at Wan 1.3B's shape, forward and forward + backward), ``int8``
(W+A int8 against bf16 where the linears dominate; ``int8_flux2``: FLUX.2's bf16 and W+A rows
alone; ``sage``: the int8-QK attention kernel alone against splash, and Wan's forward with it,
bf16 at 480p x 81 and W+A int8 at 480p x 17; ``sage_flux2``: FLUX.2-klein-4B's bf16, W+A and
W+A + sage rows in one process), ``vae`` (the Wan 2.1 decode, ``benchmarks/vae_decode.py``;
``vae_old`` the plain path), ``flash_tiles`` (flash's forward at other tiles), ``memprobe``
(what the device's peak counts), ``big`` (Wan 2.1 14B with ``model.offload=host``, bf16 and
int8, and FLUX.1-dev int8 resident: issue 55's out-of-memory rows), ``big2`` (offload + int8:
Wan 14B at 720p, Wan 2.1 I2V 14B, LTX-2 at 512x768x121, FLUX.2-dev last), ``vsa`` (VSA's table
fine pass against dense splash at densities 50 / 25 / 12.5 %, ``benchmarks/vsa_table.py``),
``vsa_tiles`` (issue 58 item 1: the table fine pass in 4 x 8 x 8 tiles against the tile that
pads Wan's 480p / 720p grids least, 12.5 / 25 / 50 %; ``vsa_table.py --tiles``),
``sparse_forward`` (Wan 1.3B's whole forward at 720p and 480p, dense splash against VSA at
~12.5 % in the auto tile). ``vsa``, ``vsa_tiles`` and ``sparse_forward``, ``sage`` and ``sage_flux2`` refuse in one line off
a TPU (their kernels interpreted would take hours).

``peak_hbm_bytes`` is the device's peak in two parts, both recorded: ``peak_bytes_in_use``
(buffers: arguments, outputs, generated code) + ``peak_bytes_reserved`` (the loaded
executables' temporaries, which this runtime reserves whole and does not count as in use:
``--part memprobe``, JAX 0.10.2), after the case, when the case raised the process's peak of
each (so it is the case's own; ``peak_hbm_how`` says so); when an earlier case's peak was
higher it is null and ``peak_hbm_at_most`` bounds it (JAX cannot reset the peak; the cases
run from small to large within a part). ``memory_stats_before`` / ``memory_stats``: the
whole dicts around the case. Rows of sessions 55 to 57 have no ``peak_hbm_how``: their
``peak_hbm_bytes`` is ``peak_bytes_in_use`` alone. ``benchmarks/plan_vs_chip.py`` compares
the rows with ``ditax plan --target tpu-v5e-1 --compile``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PEAK_BF16 = 197e12    # TPU v5e, per chip (cloud.google.com/tpu/docs/v5e)


def _commit() -> str:
    env = os.environ.get("DITAX_COMMIT")
    if env:
        return env
    try:
        # --dirty: a tree that is not its HEAD's says so (session 63: the lent machine's .git
        # named an older commit than the tree it ran; pass DITAX_COMMIT from here)
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except Exception:   # no git on the chip's machine: the caller passes DITAX_COMMIT
        return "unknown"


def run(parts, out: str, budget_s: float, repeats: int) -> None:
    import jax

    from tpu_sweep import WAN, Sweep, attention_cases, int8_cases, model_case

    base = {"jax": jax.__version__, "commit": _commit()}

    class Chip(Sweep):
        rows: list = []

        def emit(self, row: dict) -> None:
            if row.get("bench") == "tpu_sweep":
                row = {**row, "bench": "tpu_chip"}
            self.rows.append(row)
            super().emit({**base, **row})

    sw = Chip(out, budget_s, repeats)
    bf = ["model.dtype=bfloat16"]
    for part in parts:
        wan = "wan2.1-t2v-1.3b"
        if part in ("forward", "wan480"):
            model_case(sw, wan, bf + ["attention.backend=splash"], (21, 60, 104),
                       "Wan 2.1 1.3B forward 480x832x81 splash", flops_shape=(16, 21, 60, 104),
                       profile=True)
        if part == "forward":
            model_case(sw, wan, bf + ["attention.backend=flash"], (21, 60, 104),
                       "Wan 2.1 1.3B forward 480x832x81 flash", flops_shape=(16, 21, 60, 104))
            model_case(sw, "flux.2-klein-4b", bf + ["attention.backend=splash"], None,
                       "FLUX.2-klein-4B forward 1024x1024 splash", flops_shape=(128, 1, 64, 64))
            model_case(sw, wan, bf + ["attention.backend=splash"], (21, 90, 160),
                       "Wan 2.1 1.3B forward 720x1280x81 splash",
                       flops_shape=(16, 21, 90, 160))
        elif part == "big":      # issue 55: what the plan says fits one 16 GB chip
            for name, cfg, extra, lat, shape in (
                    ("Wan 2.1 14B forward 480x832x81 offload=host", "wan2.1-t2v-14b",
                     ["model.offload=host"], (21, 60, 104), (16, 21, 60, 104)),
                    ("Wan 2.1 14B forward 480x832x81 offload=host int8", "wan2.1-t2v-14b",
                     ["model.offload=host", "model.quantize=int8"], (21, 60, 104),
                     (16, 21, 60, 104)),
                    # last: its resident 8-bit weights' peak hides the offloaded ones'
                    ("FLUX.1-dev forward 1024x1024 int8", "flux.1-dev",
                     ["model.quantize=int8"], (1, 128, 128), (16, 1, 128, 128))):
                model_case(sw, cfg, bf + ["attention.backend=splash"] + extra, lat, name,
                           flops_shape=shape)
        elif part == "big2":     # issue 55 item 1: the other big models, the plan's options
            q = ["model.offload=host", "model.quantize=int8"]
            for name, cfg, lat, shape in (
                    ("Wan 2.1 14B forward 720x1280x81 offload=host int8", "wan2.1-t2v-14b",
                     (21, 90, 160), (16, 21, 90, 160)),
                    ("Wan 2.1 I2V 14B forward 480x832x81 offload=host int8",
                     "wan2.1-i2v-14b-480p", (21, 60, 104), None),
                    ("LTX-2 forward 512x768x121 offload=host int8", "ltx-2", (16, 16, 24), None),
                    # last: 32B parameters, ~32 GB of int8 on the 40 GiB host
                    ("FLUX.2-dev forward 1024x1024 offload=host int8", "flux.2-dev", None,
                     (128, 1, 64, 64))):
                model_case(sw, cfg, bf + ["attention.backend=splash"] + q, lat, name,
                           flops_shape=shape)
        elif part in ("int8", "int8_flux2"):
            cases = (("Wan 2.1 1.3B 480x832x17", "wan2.1-t2v-1.3b", (5, 60, 104),
                      (16, 5, 60, 104)),
                     ("FLUX.2-klein-4B 1024x1024", "flux.2-klein-4b", None, (128, 1, 64, 64)))
            quants = ([], ["model.quantize=int8"],
                      ["model.quantize=int8", "model.quantize_activations=true"])
            if part == "int8_flux2":      # the bf16 and W+A rows of FLUX.2 alone
                cases, quants = cases[1:], quants[::2]
            for name, cfg, lat, shape in cases:
                for q in quants:
                    tag = "+".join(x.split("=")[0].split(".")[1] for x in q) or "bf16"
                    model_case(sw, cfg, bf + ["attention.backend=splash"] + q, lat,
                               f"{name} forward {tag}", flops_shape=shape)
        elif part == "attention":
            attention_cases(sw, WAN, [("splash", {})], grad=True)
            # the padded keys' ways (auto takes "duplicate" at Wan's 8 padded keys)
            attention_cases(sw, WAN, [("splash", dict(padded_keys=m))
                                      for m in ("mask", "split")] + [("flash", {})],
                            grad=False)
            # the kernel's ceiling at these tiles: a length of whole blocks, nothing masked
            attention_cases(sw, (1, 32768) + WAN[2:], [("splash", {})], grad=False)
        elif part == "sage":    # issue 54 item 3: 8-bit attention (int8 QK^T) on the MXU
            # 128 (the old default), 512, the default now (1024: SAGE_TILES), 2048 x 1024
            tiles = [dict(block_q=q, block_kv=kv)
                     for q, kv in ((128, 128), (512, 512), (2048, 1024))] + [{}]
            attention_cases(sw, WAN, [("sage", t) for t in tiles] + [("splash", {})],
                            grad=False)
            timed = [(r["value"], r["options"]) for r in sw.rows
                     if r.get("backend") == "sage" and r.get("metric") == "time"]
            best = min(timed, key=lambda t: t[0])[1] if timed else {}
            sage = ["attention.backend=sage"] + [f"attention.{a}={b}" for a, b in best.items()]
            model_case(sw, wan, bf + sage, (21, 60, 104),
                       "Wan 2.1 1.3B forward 480x832x81 sage", flops_shape=(16, 21, 60, 104))
            model_case(sw, wan, bf + sage + ["model.quantize=int8",
                                             "model.quantize_activations=true"], (5, 60, 104),
                       "Wan 2.1 1.3B 480x832x17 forward quantize+quantize_activations+sage",
                       flops_shape=(16, 5, 60, 104))
        elif part == "sage_flux2":    # issue 54 item 3: FLUX.2 W+A int8 with 8-bit attention
            wa = ["model.quantize=int8", "model.quantize_activations=true"]
            for name, extra in (("bf16", []), ("W+A int8", wa)) + tuple(
                    (f"W+A int8 + sage {b}", wa + ["attention.backend=sage",
                                                   f"attention.block_q={b}",
                                                   f"attention.block_kv={b}"])
                    for b in (512, 1024)):
                model_case(sw, "flux.2-klein-4b", bf + (extra if "sage" in name else
                                                        ["attention.backend=splash"] + extra),
                           None, f"FLUX.2-klein-4B 1024x1024 forward {name}",
                           flops_shape=(128, 1, 64, 64))
        elif part == "int8_gemm":
            int8_cases(sw, [(32768, 1536, 8960)])
        elif part == "vae":
            _vae(sw)
        elif part == "vae_old":
            _vae(sw, ("old",))
        elif part == "flash_tiles":   # issue 54: flash within 10% of splash (1.14x in session 57)
            attention_cases(sw, WAN, [("flash", dict(block_q=q, block_kv=kv, block_kv_compute=c))
                                      for q, kv, c in FLASH_TILES], grad=False)
        elif part == "memprobe":
            sw.emit(memory_probe())
        elif part == "vsa":     # issue 58 item 5
            from vsa_table import vsa_cases

            vsa_cases(sw)
        elif part == "sparse_forward":   # issue 58 item 5: the whole forward, dense vs VSA
            for res, lat, topk in (("720x1280", (21, 90, 160), 26), ("480x832", (21, 60, 104), 11)):
                for tag, extra in sparse_forward_settings(topk):
                    model_case(sw, wan, bf + extra, lat, f"Wan 2.1 1.3B forward {res}x81 {tag}",
                               flops_shape=(16,) + lat)
        elif part == "vsa_tiles":   # issue 58 item 1: 4x8x8 against the least-padding tile
            from vsa_table import tile_cases

            tile_cases(sw)


def sparse_forward_settings(topk: int):
    """Dense splash against VSA (auto tile, the pick table's fine pass, ``topk`` of the auto
    tiles: 26 of 210 at 720p, 11 of 91 at 480p, ~12.5 %): the rows' settings."""
    return (("splash", ["attention.backend=splash"]),
            (f"vsa topk={topk} tile=auto table", [
                "attention.backend=flash", "attention.sparsity=vsa", "attention.tile=auto",
                f"attention.topk={topk}", "attention.vsa_fine=table"]))


#: flash's forward tiles tried at Wan's shape (the table's row first: (2048, 4096, 1024))
FLASH_TILES = ((2048, 4096, 1024), (2048, 4096, 2048), (4096, 4096, 1024), (1024, 4096, 1024),
               (2048, 8192, 1024), (2048, 2048, 2048), (4096, 8192, 2048))


def memory_probe(n: int = 16384) -> dict:
    """Does ``memory_stats()["peak_bytes_in_use"]`` count a program's temporaries on this
    runtime? (Session 57: the 1.3B forward's peak read 2.71 GiB for 2.65 GiB of weights, the
    14B offloaded one's 0.51 GiB, where the compiled programs need GiBs of temporaries.)
    ``(x @ x) @ x`` for a bf16 ``[n, n]`` ``x``: the compiler's ``memory_analysis()`` (its
    temporaries: at least the inner product) beside the device's stats before and after one
    call. Run it first in a process (the peak only grows)."""
    import jax
    import jax.numpy as jnp

    from tpu_sweep import device_stats

    x = jax.device_put(jnp.ones((n, n), jnp.bfloat16), jax.devices()[0])
    f = jax.jit(lambda a: (a @ a) @ a)
    compiled = f.lower(x).compile()
    ma = compiled.memory_analysis()
    before = device_stats()
    jax.block_until_ready(compiled(x))
    after = device_stats()
    row = {"bench": "tpu_chip", "case": f"memory probe (x @ x) @ x, bf16 [{n}, {n}]",
           "metric": "peak_bytes_in_use_delta", "unit": "bytes",
           "value": after.get("peak_bytes_in_use", 0) - before.get("peak_bytes_in_use", 0),
           "stats_before": before, "stats_after": after}
    for k in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
              "alias_size_in_bytes", "generated_code_size_in_bytes"):
        row[k] = getattr(ma, k, None)
    return row


def _vae(sw, variants=("fast",)) -> None:
    """The Wan 2.1 decode at 480p and 720p x 81 frames in bf16, in this process
    (``benchmarks/vae_decode.py``'s ``measure``; its own script runs each variant in a child
    process, which cannot open the chip while this one holds it)."""
    from tpu_sweep import case_peak, device_stats

    try:
        import vae_decode
    except ImportError as e:
        sw.emit({"bench": "tpu_chip", "case": "Wan 2.1 VAE decode", "error": str(e)})
        return
    for h, w in ((480, 832), (720, 1280)):
        for variant in variants:
            case = f"Wan 2.1 VAE decode {h}x{w}x81 bf16 {variant}"
            if time.time() > sw.deadline:
                sw.emit({"bench": "tpu_chip", "case": case, "skipped": "budget"})
                continue
            try:
                before = device_stats()
                row = vae_decode.measure(h, w, 81, "bfloat16", variant)
                after = device_stats()
                sw.emit({**row, "bench": "tpu_chip", "case": case,
                         "compile_plus_first_s": row["compile_s"] + row["first_call_s"],
                         "memory_stats_before": before, "memory_stats": after,
                         **case_peak(before, after)})   # its own peak, in this process
            except Exception as e:
                sw.emit({"bench": "tpu_chip", "case": case,
                         "error": str(e).splitlines()[0][:300]})


def table(jsonl: str) -> str:
    """A markdown table of the rows of ``jsonl``: one line per timed row (median s, analytic
    FLOPs, TFLOP/s and MFU against the chip's bf16 peak, peak HBM), a line per skipped or
    failed case, under a line naming the chip, JAX and commits."""
    rows = [json.loads(x) for x in open(jsonl) if x.strip()]
    lines = ["| session | case | median s | FLOPs | TFLOP/s | MFU | peak HBM GiB | compile+first s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        case = r.get("case") + (f" ({r['mode']})" if r.get("mode") else "")
        if r.get("metric") not in (None, "time", "forward", "decode", "wall"):
            case += f": {r['metric']}"
        session = r.get("session", "")
        if "value" not in r:
            why = (r.get("error") or r.get("skipped") or "")[:90]
            lines.append(f"| {session} | {case} | — ({why}) | | | | | |")
            continue
        value = (f"{r['value']:.3f}" if r.get("unit", "s") == "s"
                 else f"{r['value']:.4g} {r['unit']}")
        f = r.get("flops") or 0.0
        tf = f"{f / r['value'] / 1e12:.0f}" if f else ""
        mfu = f"{r['mfu']:.0%}" if r.get("mfu") is not None else ""
        hbm = r.get("peak_hbm_bytes")
        hbm = (f"{hbm / 2**30:.2f}" + ("" if r.get("peak_hbm_how") else "*")) if hbm else ""
        first = r.get("compile_plus_first_s")
        first = f"{first:.0f}" if first is not None else ""
        flops = f"{f:.3g}" if f else ""
        lines.append(f"| {session} | {case} | {value} | {flops} | {tf} | {mfu} | {hbm} | "
                     f"{first} |")
    kinds = sorted({r.get("device_kind", "") for r in rows})
    commits = sorted({r.get("commit", "") for r in rows})
    head = (f"Measured on {', '.join(kinds)} (JAX {rows[0].get('jax', '?')}), commit "
            f"{', '.join(commits)}; rows in `{os.path.basename(jsonl)}` (a row's `source`, "
            f"where present, says how it was measured; else `benchmarks/tpu_chip.py`). MFU "
            f"against {PEAK_BF16 / 1e12:.0f} TFLOP/s bf16. Peak HBM: peak_bytes_in_use + "
            f"peak_bytes_reserved (buffers + executables' temporaries) where a row has "
            f"`peak_hbm_how`, else peak_bytes_in_use alone (marked *).")
    return head + "\n\n" + "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", nargs="+", default=["forward", "attention", "int8", "vae"],
                   choices=["forward", "wan480", "attention", "int8", "int8_flux2", "int8_gemm",
                            "vae", "vae_old", "big", "big2", "memprobe", "flash_tiles", "vsa",
                            "sage", "sage_flux2", "vsa_tiles", "sparse_forward"])
    p.add_argument("--out", default="docs/tpu_v5e.jsonl")
    p.add_argument("--budget-s", type=float, default=480)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--table", default=None, help="print a markdown table of this jsonl's rows")
    a = p.parse_args()
    if a.table:
        print(table(a.table), end="")
        return
    from ditax.tpu_env import raise_scoped_vmem

    # before anything starts JAX's backend (off_chip_refusal asks for its devices): the flag
    # is read once, when the TPU backend starts, and the large attention tiles need it
    raise_scoped_vmem()
    off_chip = off_chip_refusal(a.part)
    if off_chip:
        raise SystemExit(off_chip)
    run(a.part, a.out, a.budget_s, a.repeats)


#: parts whose Pallas kernels, interpreted off a TPU at Wan's sizes, would run for hours
CHIP_ONLY = {"vsa": "python benchmarks/vsa_table.py --small",
             "vsa_tiles": "python benchmarks/vsa_table.py --tiles --small",
             "sparse_forward": "pytest tests/models/wan/test_sparse_attention.py",
             "sage": "pytest tests/attention/test_sage.py",
             "sage_flux2": "pytest tests/attention/test_sage.py"}


def off_chip_refusal(parts) -> str | None:
    """One line for a part of :data:`CHIP_ONLY` asked for where JAX has no TPU (else None)."""
    chip_only = [p for p in parts if p in CHIP_ONLY]
    if not chip_only:
        return None
    import jax

    platform = jax.devices()[0].platform
    if platform == "tpu":
        return None
    p = chip_only[0]
    return (f"tpu_chip.py --part {p} times Pallas TPU kernels at Wan's sizes; JAX's platform "
            f"here is {platform} (interpreted they would take hours): run it on the chip, or "
            f"{CHIP_ONLY[p]} for the code path on CPU")


if __name__ == "__main__":
    main()
