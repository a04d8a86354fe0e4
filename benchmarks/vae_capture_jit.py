"""``benchmarks/vae_capture.py``'s compiled side: the Wan decoder's first chunk as jitted
programs (what ``vae_decode.py`` and a real decode run), where ``vae_capture.py`` itself
runs it eagerly, one kernel call at a time.

:func:`jit_calls` (``--jit-calls packed,fast``): the first chunk jitted on that path with
``conv_tpu.causal_conv3x3`` wrapped while it traces, so that each kept call's inputs and
output (what the compiled program fed the kernel and what the kernel gave it) are outputs of
the program; then, per call, its output against :func:`vae_capture.reference` on those
inputs and against the same kernel run alone on them (``program_vs_rerun``: non-zero where
the compiled program runs the kernel differently from a program of its own — or packs its
weights differently: the rerun repacks them from the captured ``w``), and the
program's frames against the eager fast ones (``frames_vs_eager_fast``: whether this
instrumented program still shows the error; its extra outputs keep every captured buffer
alive, which changes XLA's buffer assignment). :func:`decodes` (``--decodes``): the first
chunk's frames eager / jitted x fast / packed, pairwise.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from vae_capture import OK_SHARE, captured, compare, first_chunk, inputs, reference
from vae_decode import frame_diffs


def _diff(u, v) -> dict:
    """Frames ``u`` against ``v`` (``[B, F, H, W, c]``): the largest difference, where, the
    mean, the share over 0.1, ``u``'s NaN count."""
    u, v = np.asarray(u, np.float32), np.asarray(v, np.float32)
    d = frame_diffs(u, v)
    return {"max_abs_diff": float(np.max(np.abs(u - v))), "at": d["max_abs_diff_at"],
            "mean_abs_diff": d["mean_abs_diff"], "share_over_0.1": d["share_over_0.1"],
            "nan": int(np.isnan(u).sum())}


def _path(variant: str, widths, interpret: bool):
    from ditax.models.vae.wan.layers import FastPath

    if variant not in ("fast", "packed"):
        raise SystemExit(f"--jit-calls: {variant!r} is not fast or packed")
    return FastPath(interpret=interpret, pack=variant == "packed",
                    only=tuple(widths) if variant == "packed" else None)


def jit_calls(vae, z, fast_frames, widths, interpret: bool, variant: str = "packed"):
    """Yield one ``jit_call`` row per kept call of the jitted first chunk on ``variant``'s
    path (packing restricted to ``widths``), then a ``jit_frames`` row."""
    from flax import nnx

    from ditax.models.vae.wan import conv_tpu

    path = _path(variant, widths, interpret)
    graphdef, state = nnx.split(vae)
    meta = []

    def step(state, z):
        v = nnx.merge(graphdef, state)
        with captured(v, set(widths)) as calls:
            frames = first_chunk(v, z, path)
        kept = [c for c in calls if "args" in c]
        meta[:] = [{**{k: c[k] for k in ("index", "name", "cin", "cout", "epilogue", "kernel")},
                    "scale": None if c["args"]["act"] is None else c["args"]["act"][1],
                    "phases": c["args"]["phases"]} for c in kept]
        arrays = [{"gamma": None if c["args"]["act"] is None else c["args"]["act"][0],
                   "out": c["out"], **{k: c["args"][k] for k in ("x", "cache", "w", "b",
                                                                  "residual")}}
                  for c in kept]
        return frames, arrays

    t = time.perf_counter()
    frames, arrays = jax.block_until_ready(jax.jit(step)(state, z))
    run_s = round(time.perf_counter() - t, 1)
    for m, a in zip(meta, arrays):
        t = time.perf_counter()
        args = {"x": a["x"], "cache": a["cache"], "w": a["w"], "b": a["b"],
                "residual": a["residual"], "phases": m["phases"],
                "act": None if a["gamma"] is None else (a["gamma"], m["scale"])}
        ref, rerun, out = (np.asarray(v, np.float32) for v in (   # on the host once
            reference(**args), conv_tpu.causal_conv3x3(**args, **m["kernel"],
                                                       interpret=interpret), a["out"]))
        row = {"kind": "jit_call", "path": variant, **{k: m[k] for k in (
            "index", "name", "cin", "cout", "epilogue", "kernel")},
               "program_vs_ref": compare(out, ref), "rerun_vs_ref": compare(rerun, ref),
               "program_vs_rerun": compare(out, rerun),
               "inputs": inputs({"args": args, "cin": m["cin"], "cout": m["cout"]})}
        row["ref_max_abs"] = row["program_vs_ref"]["ref_max_abs"]
        row["ok"] = row["program_vs_ref"]["max_abs_diff"] <= OK_SHARE * row["ref_max_abs"]
        row["s"] = round(time.perf_counter() - t, 2)
        yield row
    yield {"kind": "jit_frames", "path": variant, "compile_and_run_s": run_s,
           "frames_vs_eager_fast": _diff(frames, fast_frames)}


def decodes(vae, z, fast_frames, widths, interpret: bool, options=None) -> dict:
    """The first chunk's frames eager packed, jitted fast and jitted packed, against eager
    fast (``fast_frames``) and each other; with ``options`` (XLA compiler options, e.g.
    ``{"xla_msa_enable": False}``) the jitted packed program compiled with them too."""
    from flax import nnx

    from ditax.models.vae.wan.chunks import decode_chunk

    fast, packed = _path("fast", widths, interpret), _path("packed", widths, interpret)
    graphdef, state = nnx.split(vae)
    t = time.perf_counter()
    frames = {"eager_fast": fast_frames, "eager_packed": first_chunk(vae, z, packed)}
    for name, path in (("jit_fast", fast), ("jit_packed", packed)):
        frames[name] = decode_chunk(graphdef, state, z, None, first=True, path=path)[0]
    pairs = [("eager_packed", "eager_fast"), ("jit_fast", "eager_fast"),
             ("jit_packed", "jit_fast"), ("jit_packed", "eager_packed")]
    row = {"kind": "decodes", "packed_widths": list(widths),
           "frame_shape": list(fast_frames.shape)}
    if options:
        row["jit_options"] = options
        try:
            program = decode_chunk.lower(graphdef, state, z, None, first=True,
                                         path=packed).compile(compiler_options=options)
            frames["jit_packed_opts"] = program(state, z, None)[0]
            pairs += [("jit_packed_opts", "jit_fast"), ("jit_packed_opts", "eager_packed")]
        except Exception as e:   # an option this compiler does not know: say so, go on
            row["jit_options_error"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
    for u, v in pairs:
        row[f"{u}_vs_{v}"] = _diff(frames[u], frames[v])
    row["s"] = round(time.perf_counter() - t, 1)
    return row
