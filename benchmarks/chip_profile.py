"""Where a program's time goes on the device: one profiled run read back with
``jax.profiler.ProfileData`` (no TensorBoard / xprof needed), summed per HLO op and per
category. For the chip scripts (``benchmarks/tpu_sweep.py``, ``benchmarks/tpu_chip.py``)."""

from __future__ import annotations

import collections
import glob
import re
import tempfile

import jax


def _category(name: str, stats: dict) -> str:
    cat = str(stats.get("hlo_category", "") or "")
    if cat:
        return cat
    long = str(stats.get("long_name", "") or stats.get("tf_op", "") or name)
    for key, label in (("splash", "attention kernel"), ("flash", "attention kernel"),
                       ("custom-call", "custom call"), ("convolution", "convolution"),
                       ("dot", "matmul"), ("copy", "copy"), ("all-", "collective")):
        if key in long:
            return label
    return re.sub(r"[.\d]+$", "", name) or name


def op_breakdown(run, top: int = 25) -> dict:
    """Profile one call of ``run()`` (which must block until its results are ready) and
    return ``{"device_ms": total, "categories": {cat: ms}, "ops": [[name, ms, count, hlo],
    ...]}`` summed over the device planes' XLA-op lines (``hlo``: the op's HLO text, cut to
    240 characters: its shapes say which copy or fusion it is; a loop's events hold its
    body's, so categories overlap); ``{}`` when no device ops were recorded."""
    d = tempfile.mkdtemp(prefix="ditax_prof_")
    jax.profiler.start_trace(d)
    try:
        run()
    finally:
        jax.profiler.stop_trace()
    paths = sorted(glob.glob(d + "/**/*.xplane.pb", recursive=True))
    if not paths:
        return {}
    data = jax.profiler.ProfileData.from_file(paths[-1])
    ops, counts, cats = collections.Counter(), collections.Counter(), collections.Counter()
    text = {}
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            if line.name not in ("XLA Ops", "Ops"):
                continue
            for e in line.events:
                ms = e.duration_ns / 1e6
                stats = dict(e.stats)
                ops[e.name] += ms
                counts[e.name] += 1
                text.setdefault(e.name, str(stats.get("long_name", "") or "")[:240])
                cats[_category(e.name, stats)] += ms
    if not ops:
        return {}
    return {"device_ms": round(sum(ops.values()), 3),
            "categories": {k: round(v, 3) for k, v in cats.most_common()},
            "ops": [[k, round(v, 3), counts[k], text[k]] for k, v in ops.most_common(top)]}


__all__ = ["op_breakdown"]
