"""Training steps on a chip (issue 54 item 1): Wan 2.1 1.3B with LoRA adapters at 480x832x81,
and a DMD2 step of the same model (LoRA student and critic over the frozen base, the base as
the teacher), random weights, batch 1, 512 text tokens. One JSON line per case.

    source benchmarks/tpu_setup.sh
    python benchmarks/tpu_train.py --out $OUT/train.jsonl [--case lora dmd2] [--repeats 3]
    python benchmarks/tpu_train.py --small        # the tiny preset on CPU: the code path only

Each case writes a two-sample latent dataset of the case's shapes (random latents and text
embeddings, an empty prompt's for the teacher's guidance) under ``--work``, builds the trainer
(``ditax.train.step.Trainer`` or ``ditax.train.distill.DistillTrainer``) on the first device,
initialises its state from the seed (the trainer's own init, as ``ditax train`` without
``init_from``), then times the first step (compile + run) and ``--repeats`` more. A row holds
the median step time, the step's model FLOPs (``ditax.plan.core.train_step_flops``: the
family's forward + backward with the trainer's ``flops_factor`` and the remat policy's
recompute), TFLOP/s and MFU against the chip's peak, and the device's own peak of the case
(``tpu_sweep.case_peak``: buffers + the executables' reserved temporaries) when the backend
reports one.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time
from bench_lines import emit

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: case -> (config overrides past the preset, trainer): LoRA rank 32 on attention + FFN (the
#: README's recipe), DMD2 with two critic updates a step and guidance 4 (the demo student's)
CASES = {
    "lora": (["lora.rank=32"], "flow"),
    "dmd2": (["lora.rank=32", "distill.method=dmd2", "distill.critic_updates=2",
              "distill.guidance=4", "flow.shift=5"], "distill"),
}
ONE = dict(data=1, fsdp=1, context=1, tensor=1)


def write_data(path: pathlib.Path, latent: tuple, text: tuple, n: int = 2, seed: int = 0) -> str:
    """``n`` random samples of ``latent`` ``[C, F, Y, X]`` and ``text`` ``[T, D]`` (every token
    real) with an empty prompt's embedding: a dataset ``ditax train`` reads."""
    from ditax.train.data_writer import DatasetWriter

    r = np.random.default_rng(seed)
    w = DatasetWriter(path, samples_per_file=n)
    for _ in range(n):
        w.add(r.standard_normal(latent).astype(np.float32),
              r.standard_normal(text).astype(np.float32), np.ones(text[0], np.uint8))
    mask = (np.arange(text[0]) < 1).astype(np.uint8)
    return str(w.close(null_text=(r.standard_normal(text).astype(np.float32) * 0.1, mask)))


def case_config(case: str, small: bool, work: pathlib.Path, extra=()):
    """The case's config and latent shape: the 1.3B preset at 480x832x81 (bf16, splash), or
    the ``tiny`` preset's shapes with ``small``."""
    from ditax.config import load_config

    overrides, _ = CASES[case]
    if small:
        preset, latent, text, base = "tiny", (16, 2, 8, 8), (16, 64), ["attention.backend=xla"]
    else:
        preset, latent, text = "wan2.1-t2v-1.3b", (16, 21, 60, 104), (512, 4096)
        base = ["attention.backend=splash", "model.dtype=bfloat16"]
    data = write_data(work / f"data_{case}", latent, text)
    cfg = load_config(preset, [f"data.source={data}", f"output_dir={work / case}",
                               "batch_size=1", *base, *overrides, *extra])
    return cfg, latent


def run_case(case: str, small: bool, work: pathlib.Path, repeats: int, extra=()) -> dict:
    """One case's row (see the module docstring)."""
    import jax

    from ditax.parallel.mesh import make_mesh
    from ditax.plan.core import train_step_flops
    from ditax.train.batches import BatchIterator
    from ditax.train.metrics import peak_tflops
    from tpu_sweep import case_peak, device_stats

    cfg, latent = case_config(case, small, work, extra)
    before = device_stats()
    t0 = time.perf_counter()
    mesh = make_mesh(ONE, jax.devices()[:1])
    if CASES[case][1] == "distill":
        from ditax.train.distill import DistillTrainer

        tr = DistillTrainer(cfg, mesh)
    else:
        from ditax.train.step import Trainer

        tr = Trainer(cfg, mesh)
    data = BatchIterator(cfg)
    if hasattr(tr, "bind_data"):
        tr.bind_data(data)
    state = tr.init()
    jax.block_until_ready(state)
    init_s = time.perf_counter() - t0
    # progress on stderr as it happens: a step cut by a caller's timeout leaves its trace
    print(f"tpu_train {case}: init {init_s:.1f} s", file=sys.stderr, flush=True)
    batch = tr.put_batch(next(data))
    times = []
    for i in range(repeats + 1):
        t = time.perf_counter()
        state, metrics = tr.step(state, batch)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t)
        print(f"tpu_train {case}: step {i} {times[-1]:.2f} s"
              f"{' (compile + run)' if i == 0 else ''}", file=sys.stderr, flush=True)
    flops = train_step_flops(cfg, tr.family, latent, getattr(tr, "flops_factor", 1.0))
    median = statistics.median(times[1:])
    peak = peak_tflops()
    row = {"bench": "tpu_train", "case": f"{cfg.name} {case} step "
           f"{'x'.join(map(str, latent))} latent", "metric": "time", "unit": "s",
           "value": round(median, 4), "times": [round(t, 4) for t in times[1:]],
           "compile_plus_first_s": round(times[0], 2), "init_s": round(init_s, 2),
           "flops": flops, "tflops": round(flops / median / 1e12, 1),
           "mfu": round(flops / median / 1e12 / peak, 3) if peak else None,
           "loss": float(metrics["loss"]), "settings": list(CASES[case][0]) + list(extra),
           "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__}
    row.update(case_peak(before, device_stats()))
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", nargs="+", choices=sorted(CASES), default=["lora", "dmd2"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--small", action="store_true", help="the tiny preset (CPU: the code path)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every case (repeatable)")
    p.add_argument("--work", default=None, help="datasets and outputs (default: a temporary dir)")
    p.add_argument("--out", default=None, help="also append the lines to this file")
    a = p.parse_args(argv)
    work = pathlib.Path(a.work or tempfile.mkdtemp(prefix="ditax_tpu_train_"))
    for case in a.case:
        try:
            row = run_case(case, a.small, work, a.repeats, a.override)
        except Exception as e:     # one case's failure (e.g. out of memory) is its row
            row = {"bench": "tpu_train", "case": case, "error": str(e).splitlines()[0][:300]}
        emit(row, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
