"""Big models on one chip through the real loader (issue 55 item 1): a full-size random-weight
transformer folder written on the chip's host, loaded by :func:`ditax.load_transformer` with
one chip's options (``model.offload=host``, ``model.quantize=int8``) and timed by ``ditax
bench``'s forward (``tpu_chip.py --part big`` drew the weights on the device instead). One
JSON line per measurement, ``tpu_chip.py``'s fields (``bench``, ``case``, ``metric``,
``value``, ``unit``, ``peak_hbm_bytes``, ``device_kind``, ``jax``, ``commit``, ``settings``),
printed and appended to ``--out``. On the chip (docs/tpu_v5e.md "The next run", item 5):

    source benchmarks/tpu_setup.sh
    timeout 400 python benchmarks/tpu_loader.py --case wan14b --keep --out $OUT/loader.jsonl \
        --budget-s 370

Per case, row ``write``: the transformer part of ``ditax init-random``'s plan of the preset
(diffusers' keys, bf16 as the real checkpoints; :func:`ditax.recipes.random_parts.write_part`
draws on every core) under ``--dir``, refused in one line where the disk or host memory is
short; the transformer alone, which ``load_transformer`` loads without the pipeline. Then
each variant in a process of its own (the device's peak is that variant's): row ``load``
(seconds; ``peak_load_bytes``: ``peak_bytes_in_use`` after the load; ``full_copy_on_device``:
the device held the bf16 weights' bytes; offloaded, ``within_a_block``: it stayed under its
own parameters + one block; off a TPU the loaded parameters' device bytes stand in) and row
``forward`` (:func:`ditax.bench.forward_benchmark`, median of ``--repeats`` after a compile
run; ``--check``: its difference from the folder loaded resident in bf16). No step starts
after ``--budget-s``; a variant running then is ended, its rows so far kept. ``--case tiny``
is the same path on CPU in seconds (tests/benchmarks/test_tpu_loader_bench.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import bench_lines

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

OFFLOAD, INT8 = "model.offload=host", "model.quantize=int8"
GiB = 2**30
FAILED = 3        # a variant's exit status after it wrote its error row


@dataclasses.dataclass(frozen=True)
class Case:
    """A preset written at its real size, the forward's ``latent`` (F, Y, X) and text length,
    the FLOP count's latent ``flops_shape`` (C, F, Y, X; None: the input's), and its
    ``variants`` (tag → config overrides)."""

    preset: str
    label: str
    latent: tuple | None
    text_len: int = 512
    flops_shape: tuple | None = None
    variants: tuple = ()


CASES = {
    "wan14b": Case("wan2.1-t2v-14b", "Wan 2.1 14B 480x832x81", (21, 60, 104), 512,
                   (16, 21, 60, 104), (("offload=host", (OFFLOAD,)),
                                       ("offload=host int8", (OFFLOAD, INT8)))),
    "flux1dev": Case("flux.1-dev", "FLUX.1-dev 1024x1024", (1, 128, 128), 512,
                     (16, 1, 128, 128), (("int8", (INT8,)),
                                         ("int8 offload=host", (INT8, OFFLOAD)))),
    "wan13b": Case("wan2.1-t2v-1.3b", "Wan 2.1 1.3B 480x832x81", (21, 60, 104), 512,
                   (16, 21, 60, 104), (("offload=host", (OFFLOAD,)), ("int8", (INT8,)))),
    "tiny": Case("tiny", "Wan tiny 32x32x5", (2, 4, 4), 16, None,
                 (("bf16", ()), ("offload=host", (OFFLOAD,)), ("int8", (INT8,)),
                  ("int8 offload=host", (INT8, OFFLOAD)))),
    "flux-tiny": Case("flux-tiny", "FLUX tiny 32x32", (1, 4, 4), 16, (16, 1, 4, 4),
                      (("bf16", ()), ("int8 offload=host", (INT8, OFFLOAD)))),
}


def emit(row: dict, out: str | None) -> None:
    bench_lines.emit(row, out, default=str)


def base_row(case: str, metric: str) -> dict:
    import jax

    from tpu_chip import _commit

    return {"bench": "tpu_loader", "case": case, "metric": metric, "jax": jax.__version__,
            "commit": _commit()}


def mem_available() -> int | None:
    """The host's ``MemAvailable`` bytes (None where /proc/meminfo has none)."""
    try:
        return next(int(x.split()[1]) * 1024 for x in open("/proc/meminfo")
                    if x.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def fs_type(path: str) -> str:
    """The file system type of the mount holding ``path`` (/proc/mounts; "?" if unknown)."""
    path = os.path.realpath(path)
    try:
        mounts = [line.split()[1:3] for line in open("/proc/mounts")]
    except OSError:
        return "?"
    inside = [m for m in mounts if path == m[0] or path.startswith(m[0].rstrip("/") + "/")]
    return max(inside, key=lambda m: len(m[0]), default=(None, "?"))[1]


def host_need(sizes: dict, overrides) -> int:
    """Host bytes a variant needs beside the process: its offloaded block weights (``sizes``
    of :func:`block_sizes`; 8-bit: half their bf16 bytes) and one stacked tensor (every
    layer's copy of one weight: the loader reads a stacked parameter whole)."""
    offloaded = sizes["blocks"] // (2 if INT8 in overrides else 1) if OFFLOAD in overrides else 0
    return offloaded + sizes["stack"]


def room(where: str, part_bytes: int, ram_need: int) -> str | None:
    """One line naming what is short to write ``part_bytes`` under ``where`` and then hold
    ``ram_need`` bytes (:func:`host_need`) in host memory (:func:`memory_short`; a memory
    file system holds the file there too), or None."""
    probe = where
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "."
    free, kind = shutil.disk_usage(probe).free, fs_type(probe)
    if free < part_bytes + GiB:
        return (f"needs {(part_bytes + GiB) / 1e9:.1f} GB free under {where} for the weights "
                f"(+1 GiB), has {free / 1e9:.1f} GB ({kind}): pass --dir on a larger disk")
    in_memory = kind in ("tmpfs", "ramfs")
    return memory_short(ram_need + (part_bytes if in_memory else 0),
                        f", the file on {kind} {where}" if in_memory else "")


def memory_short(need: int, what: str = "") -> str | None:
    """One line when the host has less memory available than ``need`` bytes + 3 GiB for the
    process (``what``: more of what the bytes are), or None."""
    avail, need = mem_available(), need + 3 * GiB
    if avail is None or avail >= need:
        return None
    return (f"needs {need / 1e9:.1f} GB of host memory (offloaded weights, one stacked tensor"
            f"{what}, 3 GiB), has {avail / 1e9:.1f} GB available: a --dir on a disk, or a "
            f"variant without model.offload=host")


def block_sizes(part) -> dict:
    """Bytes of ``part``'s blocks (keys ``...blocks.N.``: Wan's ``blocks``, FLUX's
    ``transformer_blocks`` and ``single_transformer_blocks``): ``block`` the largest block's,
    ``blocks`` all of them, ``stack`` the largest stacked tensor's (one weight of every block
    of a stack)."""
    import numpy as np

    from ditax.recipes.random_parts import numpy_dtype

    item, per, stacks = np.dtype(numpy_dtype(part.dtype)).itemsize, {}, {}
    for key, shape in part.tensors:
        m = re.match(r"(.*blocks)\.(\d+)\.(.*)", key)
        if m:
            n = item * int(np.prod(shape, dtype=np.int64))
            per[m.groups()[:2]] = per.get(m.groups()[:2], 0) + n
            stack = (m.group(1), m.group(3))
            stacks[stack] = stacks.get(stack, 0) + n
    return {"block": max(per.values(), default=0), "blocks": sum(per.values()),
            "stack": max(stacks.values(), default=0)}


def write(case: Case, part, where: str, out: str | None):
    """The case's transformer ``part`` (its random folder plan's) written as the folder
    ``where/transformer``, which is returned (kept when complete: its ``config.json`` is
    written last)."""
    import concurrent.futures
    import pathlib

    from ditax.recipes.random_parts import write_part

    folder, row = pathlib.Path(where) / part.name, base_row(f"{case.label} write", "write")
    if (folder / "config.json").exists():
        emit({**row, "skipped": f"kept from an earlier run: {folder}"}, out)
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    threads = os.cpu_count() or 1
    before, t0 = mem_available(), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        write_part(pathlib.Path(where), part, 0, pool, ahead=2 * threads)
    took = time.perf_counter() - t0
    emit({**row, "value": round(took, 2), "unit": "s", "bytes": part.nbytes,
          "params": part.params, "tensors": len(part.tensors),
          "files": len(list(folder.glob("*.safetensors"))),
          "gb_per_s": round(part.nbytes / took / 1e9, 3), "dir": str(where),
          "fs": fs_type(where), "threads": threads,
          "mem_available_before": before, "mem_available_after": mem_available(),
          "device_kind": None, "peak_hbm_bytes": None, "settings": ["dtype=bfloat16"]}, out)
    return folder


# -- one variant, in its own process ------------------------------------------------------------

def variant(spec: dict) -> None:
    """Load ``spec``'s folder with its overrides (:func:`load`), time the forward, emit its
    row (``spec``: what :func:`run` passes as ``--child``)."""
    import jax
    import numpy as np

    import ditax
    from ditax.bench import forward_benchmark, forward_inputs
    from ditax.models.base import model_family
    from ditax.parallel.mesh import make_mesh
    from ditax.recipes.random_folders import resolve_preset
    from tpu_sweep import PEAK, _gen, case_peak, device_stats

    case = CASES[spec["case"]]
    name = f"{case.label} loaded {spec['tag']}"
    platform = jax.devices()[0].platform
    attention = spec["attention"] or ("splash" if platform == "tpu" else "xla")
    settings = ["model.dtype=bfloat16", f"attention.backend={attention}", *spec["overrides"]]
    cfg = resolve_preset(case.preset, settings)[0]
    mesh = make_mesh(dict(data=1, fsdp=1, context=1, tensor=1), jax.devices()[:1])
    common = {"device_kind": jax.devices()[0].device_kind, "settings": settings,
              "folder": spec["folder"]}
    tr, loaded = load(spec, cfg, mesh, name, common)
    fwd = forward_benchmark(cfg, mesh, case.latent, case.text_len, spec["repeats"],
                            transformer=tr)
    after = device_stats()
    flops = model_family(cfg.model, cfg.attention).flops_per_sample(
        tuple(case.flops_shape or fwd["latent"][1:]), case.text_len) / 3.0
    fwd.update(base_row(name, "forward"), **common, flops=flops, load_s=loaded["value"],
               memory_stats_before=loaded["memory_stats"], memory_stats=after,
               **case_peak(loaded["memory_stats"], after))
    if platform == "tpu":
        fwd["mfu"] = round(flops / fwd["value"] / PEAK.get(_gen(), (197e12,))[0], 3)
    if spec["check"]:
        args, kwargs = forward_inputs(cfg, mesh, case.latent, case.text_len)
        got = np.asarray(tr(*args, **kwargs), np.float32)
        del tr
        ref = ditax.load_transformer(spec["folder"], dtype="bfloat16", mesh=mesh,
                                     attention=cfg.attention)
        want = np.asarray(ref(*args, **kwargs), np.float32)
        fwd["max_abs_diff_vs_bf16_resident"] = float(np.max(np.abs(got - want)))
        fwd["rel_err_vs_bf16_resident"] = float(np.linalg.norm(got - want)
                                                / np.linalg.norm(want))
        fwd["finite"] = bool(np.isfinite(got).all())
    emit(fwd, spec["out"])


def load(spec: dict, cfg, mesh, name: str, common: dict):
    """``ditax.load_transformer`` of ``spec``'s folder with its ``model.*`` overrides (their
    values as ``cfg`` parsed them) on ``mesh``; emits and returns ``(transformer, the load
    row)``: seconds, where the parameters are, the device's peak during the load against the
    bf16 weights (and, offloaded, against its own parameters + one block)."""
    import jax

    import ditax
    from ditax.nn.offload import HOST, host_bytes
    from tpu_sweep import device_stats

    overrides = spec["overrides"]
    model = {k: getattr(cfg.model, k)
             for k in (o.split("=")[0].split(".", 1)[1] for o in overrides)}
    before = device_stats()
    t0 = time.perf_counter()
    tr = ditax.load_transformer(spec["folder"], dtype="bfloat16", mesh=mesh,
                                attention=cfg.attention, **model)
    jax.block_until_ready(jax.tree.leaves(tr))
    load_s = time.perf_counter() - t0
    stats = device_stats()
    leaves = [x for x in jax.tree.leaves(tr) if isinstance(x, jax.Array)]
    on_device = sum(x.nbytes for x in leaves if x.sharding.memory_kind != HOST)
    peak = stats.get("peak_bytes_in_use")
    measured = on_device if peak is None else peak
    full = measured >= spec["weight_bytes"]
    row = {**base_row(name, "load"), "value": round(load_s, 2), "unit": "s", **common,
           "weight_bytes": spec["weight_bytes"], "block_bytes": spec["block_bytes"],
           "device_param_bytes": on_device, "host_param_bytes": host_bytes(leaves),
           "peak_load_bytes": peak, "device_load_bytes": measured,
           "device_load_how": ("memory_stats peak_bytes_in_use after the load" if peak is not None
                               else "the loaded parameters' device bytes (no memory_stats)"),
           "full_copy_on_device": full, "memory_stats_before": before,
           "memory_stats": stats, "peak_hbm_bytes": peak}
    if OFFLOAD in overrides:
        row["within_a_block"] = measured <= on_device + spec["block_bytes"]
    row["ok"] = (full == (not overrides)) and row.get("within_a_block", True)
    emit(row, spec["out"])
    if not row["ok"]:
        print(f"tpu_loader: {name}: the device held {measured / GiB:.2f} GiB during the load; "
              f"bf16 weights {spec['weight_bytes'] / GiB:.2f}, its parameters {on_device / GiB:.2f}"
              f", a block {spec['block_bytes'] / GiB:.2f} GiB", file=sys.stderr)
    return tr, row


# -- the run -------------------------------------------------------------------------------------

def run(a, env=None) -> int:
    """Each case of ``a.case``: room checked, folder written, each variant in a child process
    (``env``: its environment; None: this one's)."""
    from ditax.recipes.random_folders import plan

    deadline = time.time() + a.budget_s
    for name in a.case:
        case = CASES[name]
        variants = [(t, o) for t, o in case.variants if not a.variants or t in a.variants]
        where = os.path.join(a.dir, name)
        part = plan(case.preset, dtype="bfloat16")[1].parts[0]
        sizes = block_sizes(part)
        need = max((host_need(sizes, o) for _, o in variants), default=0)
        short = None if os.path.exists(os.path.join(where, "transformer", "config.json")) \
            else room(where, part.nbytes, need)
        if short or time.time() > deadline:
            emit({**base_row(f"{case.label} write", "write"),
                  "skipped": f"{name} {short}" if short else "budget"}, a.out)
            if short:
                print(f"tpu_loader: {name} {short}", file=sys.stderr)
            continue
        folder = write(case, part, where, a.out)
        for tag, overrides in variants:
            label = f"{case.label} loaded {tag}"
            short = memory_short(host_need(sizes, overrides))
            if short or time.time() > deadline:
                emit({**base_row(label, "load"), "skipped": short or "budget",
                      "settings": list(overrides)}, a.out)
                continue
            spec = dict(case=name, tag=tag, overrides=list(overrides), folder=str(folder),
                        weight_bytes=part.nbytes, block_bytes=sizes["block"], repeats=a.repeats,
                        attention=a.attention, check=a.check, out=a.out)
            child(spec, deadline - time.time(), env, label, a.out)
        if not a.keep:
            shutil.rmtree(where, ignore_errors=True)
    return 0


def child(spec: dict, limit: float, env, name: str, out: str | None) -> None:
    """:func:`variant` of ``spec`` in a process of its own, ended after ``limit`` seconds."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    proc = subprocess.Popen(cmd, env=env)
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        emit({**base_row(name, "forward"), "error": f"budget: ended after {limit:.0f} s",
              "settings": spec["overrides"]}, out)
        return
    finally:
        if proc.poll() is None:     # this process was ended: its child goes too
            proc.kill()
    if rc not in (0, FAILED):      # (FAILED: the variant wrote its error row)
        emit({**base_row(name, "forward"), "error": f"the variant's process exited {rc}",
              "settings": spec["overrides"]}, out)


def main(argv=None, env=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", nargs="+", default=["wan14b"], choices=sorted(CASES))
    p.add_argument("--variants", nargs="+", default=None,
                   help="only these variants' tags (e.g. 'offload=host int8')")
    p.add_argument("--dir", default="/tmp/ditax_loader",
                   help="where the folders are written (a disk: a tmpfs holds them in memory)")
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=360)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--attention", default=None, help="default: splash on a TPU, else xla")
    p.add_argument("--check", action="store_true",
                   help="compare each forward with the folder loaded resident in bf16 "
                        "(small cases: it needs the bf16 weights on the device)")
    p.add_argument("--keep", action="store_true", help="keep the written folders")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    tags = {t for c in a.case for t, _ in CASES[c].variants}
    if a.variants and not set(a.variants) <= tags:
        p.error(f"--variants {' '.join(sorted(set(a.variants) - tags))}: the cases' variants "
                f"are {', '.join(sorted(tags))}")
    if a.child:
        from ditax.tpu_env import raise_scoped_vmem

        raise_scoped_vmem()   # before JAX starts the chip, as every ditax command: splash's tiles
        spec = json.loads(a.child)
        try:
            variant(spec)
        except Exception as e:     # one line in the rows; the whole story on stderr
            import traceback

            traceback.print_exc()
            emit({**base_row(f"{CASES[spec['case']].label} loaded {spec['tag']}", "forward"),
                  "error": (str(e).splitlines() or [type(e).__name__])[0][:300],
                  "settings": spec["overrides"]}, spec["out"])
            return FAILED
        return 0
    return run(a, env)


if __name__ == "__main__":
    child_env = dict(os.environ)
    if "--child" not in sys.argv:   # this process plans and writes; its variants open the chip
        os.environ["JAX_PLATFORMS"] = "cpu"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # `timeout`: end the child too
    raise SystemExit(main(env=child_env))
