"""The Wan 2.1 VAE decoder's own kernel calls, captured and checked one at a time (issue 54
item 4: on a TPU v5e the packed decode differs from the fast one by up to 0.93 at 480x832,
already in the first chunk, while every 96-channel packed kernel agrees with the padded one
on ``benchmarks/vae_conv_pack.py --chip``'s random inputs).

1. Builds the Wan 2.1 VAE (:func:`vae_decode.build_vae`: random weights, ``--dtype``,
   bfloat16 by default) and runs the decoder's first chunk (one latent frame: the program that
   starts from a zero cache) **eagerly** on the fast path (``path="fast"``: padded kernels,
   ``pack=None``) with :func:`ditax.models.vae.wan.conv_tpu.causal_conv3x3` wrapped: every
   call is numbered and named (the module's path, e.g. ``decoder.up_blocks.3.resnets.0.
   conv1``), and where its real input channels are in ``--widths`` (default 96: the 480x832
   level's six convolutions and ``conv_out``) its concrete arguments are kept (x, cache, w, b,
   act, residual, phases) with the output the decoder got.
2. For each kept call: the padded kernel again (``pack=None``), the packed one (``pack`` = the
   real input channels, ``cols`` as ``path="packed"``'s ``FastPath.cols_for`` picks) and an XLA
   reference in float32 (:func:`reference`: ``lax.conv_general_dilated`` at precision
   HIGHEST on ``concat([cache, x])`` with one zero pixel of spatial padding, ``+ b``, then the
   epilogue as :mod:`~ditax.models.vae.wan.conv_tpu` computes it, rounding to the activations'
   dtype where the kernel does). One JSON line a call (``"kind": "call"``): its shapes and
   epilogue; ``padded_vs_ref``, ``packed_vs_ref``, ``packed_vs_padded`` (``max_abs_diff``,
   ``at`` = [frame, row, column, channel], ``mean_abs_diff``, ``bad_share`` and the rows /
   columns / channels off by more than ``tol``: :func:`vae_conv_pack.where_different`),
   ``ref_max_abs``, NaN counts, ``decoder_vs_padded`` (the rerun against what the decoder got:
   0 unless the kernel is not deterministic) and the inputs' statistics (:func:`inputs`:
   largest ``|x|``, the padded channels' non-zero share and largest value in x, cache,
   residual, weights and gamma — the benchmark's inputs have zero padded channels and N(0, 1)
   real ones: are the decoder's different?). ``ok``: both kernels within ``2^-6`` of the
   reference's largest value (``vae_conv_pack.py --chip``'s test).
3. ``--decodes``: then the first chunk's frames four ways — eager fast (above), eager packed
   (``FastPath(pack=True, only=widths)``), and the jitted programs of both (what
   ``vae_decode.py`` runs) — one line (``"kind": "decodes"``) with each pair's difference: if
   the jitted pair differs (session 64: 0.55 in frame 0) but the eager pair does not, the
   error is in how the compiled program feeds the kernels, not in what they are fed;
   ``--jit-options k=v,...`` compiles the jitted packed program once more with those XLA
   options (e.g. ``xla_msa_enable=false``: no prefetches into VMEM beside the kernels).

4. ``--jit-calls packed`` (and/or ``fast``): the first chunk jitted on that path with the
   kept calls' inputs and outputs as the program's outputs, each call checked as the
   compiled program ran it (:func:`vae_capture_jit.jit_calls`: ``jit_call`` lines, then
   ``jit_frames``) — which call a compiled program gets wrong, and on what inputs.

A leading line (``"kind": "capture"``) lists every kernel call (index, name, real channels,
epilogue). ``--interpret`` runs everything in Pallas' interpret mode on the CPU (tests, at a
small size: ``--interpret --height 64 --width 64``, the full-size VAE's 33 calls with the same
7 kept, took 135 s on a 2-core host, every call ``ok``, the largest difference 0.0156 at a
``ref_max_abs`` of 5.19). On the chip (see ``docs/tpu_v5e.md``, "The next run")::

    PYTHONPATH=$PWD/src:$PYTHONPATH python3 benchmarks/vae_capture.py --height 480 \
        --width 832 --jit-calls packed --decodes
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lines import emit  # noqa: E402
from vae_conv_pack import where_different  # noqa: E402
from vae_decode import build_vae, frame_diffs  # noqa: E402

#: a kernel within this share of the reference's largest value is right (bf16: 2 ulps there)
OK_SHARE = 2 ** -6


def _module_names(vae) -> dict[int, str]:
    from flax import nnx

    return {id(m): ".".join(map(str, p)) for p, m in nnx.iter_graph(vae)
            if isinstance(m, nnx.Module)}


@contextlib.contextmanager
def captured(vae, widths):
    """While inside, every ``conv_tpu.causal_conv3x3`` call is appended to the yielded list as
    a dict: ``index``, ``name`` (the calling layer's path in ``vae``), ``cin`` / ``cout`` (its
    real channels), ``epilogue``, ``shapes``; with ``args`` (the call's concrete arguments)
    and ``out`` (its result) where ``cin`` is in ``widths``. Wraps the kernel function and the
    two layer methods that call it (for the names), restored on exit."""
    from ditax.models.vae.wan import conv_tpu, layers

    names, calls, current = _module_names(vae), [], [None]
    kernel = conv_tpu.causal_conv3x3
    methods = [(layers.CausalConv3d, "fused", lambda m: m.weight.shape[3:5]),
               (layers.Conv2d, "upsampled", lambda m: m.weight.shape[2:4])]

    def named(method, real):
        def wrapper(self, *a, **kw):
            saved, current[0] = current[0], (names.get(id(self), "?"), *real(self))
            try:
                return method(self, *a, **kw)
            finally:
                current[0] = saved
        return wrapper

    def conv(x, cache, w, b, *, act=None, residual=None, phases=False, **kw):
        y = kernel(x, cache, w, b, act=act, residual=residual, phases=phases, **kw)
        name, cin, cout = current[0] or ("?", None, None)
        epilogue = ("act" if act is not None else "residual" if residual is not None
                    else "phases" if phases else "narrow" if 3 * w.shape[-1] <= conv_tpu.LANES
                    else "plain")
        call = {"index": len(calls), "name": name, "cin": cin, "cout": cout,
                "epilogue": epilogue, "dtype": str(x.dtype),
                "kernel": {k: kw.get(k) for k in ("pack", "cols")},   # the path's choice
                "shapes": {k: None if v is None else list(v.shape) for k, v in
                           (("x", x), ("cache", cache), ("w", w), ("out", y))}}
        if cin in widths:
            call["args"] = dict(x=x, cache=cache, w=w, b=b, act=act, residual=residual,
                                phases=phases)
            call["out"] = y
        calls.append(call)
        return y

    saved = [(cls, attr, getattr(cls, attr)) for cls, attr, _ in methods]
    try:
        conv_tpu.causal_conv3x3 = conv
        for (cls, attr, real), (_, _, method) in zip(methods, saved):
            setattr(cls, attr, named(method, real))
        yield calls
    finally:
        conv_tpu.causal_conv3x3 = kernel
        for cls, attr, method in saved:
            setattr(cls, attr, method)


def first_chunk(vae, z, path):
    """The decoder's first chunk (``chunks.decode_chunk``'s body, not jitted: every layer runs
    eagerly, so each kernel call sees concrete arrays) → unclipped frames ``[B, 1, H, W, c]``."""
    from ditax.models.vae.wan.layers import fast_path

    with fast_path(path):
        x = vae.post_quant_conv(z)[0]
        return vae.decoder(x, None, True)[0]


def latents(vae, height: int, width: int, dtype: str, seed: int = 0):
    """One random latent frame, channels-last ``[1, 1, Y, X, z_dim]`` (``vae_decode.measure``'s
    draw for its first frame)."""
    _, y, x = vae.config.latent_grid(1, height, width)
    z = jax.random.normal(jax.random.key(seed + 7), (1, vae.config.z_dim, 1, y, x), jnp.float32)
    return jnp.transpose(z.astype(dtype), (0, 2, 3, 4, 1))


def reference(x, cache, w, b, act=None, residual=None, phases=False):
    """The call's convolution and epilogue in float32 (inputs as given): XLA's convolution at
    precision HIGHEST of ``concat([cache, x])`` (valid in time, one zero pixel around each
    frame), ``+ b``, then the epilogue in the kernel's order with its roundings to x's dtype:
    ``y``, ``y + residual``; RMSNorm (float32 norm, eps 1e-12 on it) rounded, times ``scale``
    (float32, as the kernel: the plain layer rounds ``sqrt(C)`` to x's dtype first), times
    gamma, each rounded, then SiLU with its sigmoid rounded; ``phases``: the 4 output phases
    (row parity, column parity, channel) as a 2x larger frame."""
    dt, f32 = x.dtype, jnp.float32
    rnd = lambda v: v.astype(dt).astype(f32)  # noqa: E731
    xs = x if cache is None else jnp.concatenate([cache.astype(dt), x], axis=1)
    y = lax.conv_general_dilated(xs.astype(f32), w.astype(f32), (1, 1, 1),
                                 [(0, 0), (1, 1), (1, 1)],
                                 dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
                                 precision=lax.Precision.HIGHEST)
    y = rnd(y + b.astype(f32))
    if residual is not None:
        y = rnd(y + residual.astype(f32))
    if act is not None:
        gamma, scale = act
        norm = jnp.sqrt(jnp.sum(y * y, axis=-1, keepdims=True))
        u = rnd(y / jnp.maximum(norm, 1e-12))
        u = rnd(rnd(u * scale) * gamma.astype(f32))
        y = u * rnd(1.0 / (1.0 + jnp.exp(-u)))
    y = rnd(y)
    if phases:
        bs, f, yy, xx, c = y.shape
        y = y.reshape(bs, f, yy, xx, 2, 2, c // 4).transpose(0, 1, 2, 4, 3, 5, 6)
        y = y.reshape(bs, f, 2 * yy, 2 * xx, c // 4)
    return y


def _pad_lanes(a, real):
    """The padded channels (``real`` on) of ``a``: non-zero share, largest |value|; None
    without any."""
    if a is None or real is None or real >= a.shape[-1]:
        return None
    pad = np.asarray(a[..., real:], np.float32)
    return {"nonzero_share": round(float((pad != 0).mean()), 6),
            "max_abs": float(np.abs(pad).max())}


def inputs(call) -> dict:
    """Statistics of a kept call's inputs: the real channels of x (largest |x|, mean, std,
    smallest, NaN / inf count) and cache (largest |value|), and the padded channels of x,
    cache, residual, the weights' input rows and gamma (:func:`_pad_lanes`)."""
    a, cin, cout = call["args"], call["cin"], call["cout"]
    x = np.asarray(a["x"][..., :cin], np.float32)
    row = {"x_max_abs": float(np.abs(x).max()), "x_mean": float(x.mean()),
           "x_std": float(x.std()), "x_min": float(x.min()),
           "x_nonfinite": int((~np.isfinite(x)).sum()),
           "cache_max_abs": None if a["cache"] is None else float(
               np.abs(np.asarray(a["cache"][..., :cin], np.float32)).max()),
           "x_pad": _pad_lanes(a["x"], cin), "cache_pad": _pad_lanes(a["cache"], cin),
           "w_pad_rows": _pad_lanes(jnp.moveaxis(a["w"], 3, -1), cin)}
    if a["residual"] is not None:
        row["residual_max_abs"] = float(np.abs(np.asarray(a["residual"], np.float32)).max())
        row["residual_pad"] = _pad_lanes(a["residual"], cout)
    if a["act"] is not None:
        row["act_scale"] = float(a["act"][1])
        row["gamma_pad"] = _pad_lanes(a["act"][0], cout)
    return row


def compare(out, ref) -> dict:
    """``out`` against ``ref`` (``[B, F, Y, X, C]``): :func:`vae_conv_pack.where_different`'s
    report (``tol``: 5 % of the reference's largest value), where the largest difference is
    (``at``: [frame, row, column, channel]), the mean difference and NaN counts."""
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    row = where_different(out, ref, 0.05 * float(np.nanmax(np.abs(ref))))
    where = frame_diffs(out, ref)
    row.update(at=where["max_abs_diff_at"], mean_abs_diff=where["mean_abs_diff"],
               nan=int(np.isnan(out).sum()), ref_nan=int(np.isnan(ref).sum()))
    return row


def check(call, interpret: bool) -> dict:
    """One kept call: the padded and packed kernels and the reference on its arguments."""
    from ditax.models.vae.wan import conv_tpu
    from ditax.models.vae.wan.layers import FastPath

    a = dict(call["args"])
    pack = call["cin"]
    cols = None if a["phases"] else FastPath(pack=True).cols_for(call["cout"])
    t = time.perf_counter()
    ref, padded, packed, got = (np.asarray(v, np.float32) for v in (   # on the host once
        reference(**a), conv_tpu.causal_conv3x3(**a, interpret=interpret),
        conv_tpu.causal_conv3x3(**a, pack=pack, cols=cols, interpret=interpret), call["out"]))
    row = {k: call[k] for k in ("index", "name", "cin", "cout", "epilogue", "dtype", "shapes",
                                "kernel")}
    row.update(pack=pack, cols=cols, inputs=inputs(call),
               padded_vs_ref=compare(padded, ref), packed_vs_ref=compare(packed, ref),
               packed_vs_padded=compare(packed, padded),
               decoder_vs_padded=float(np.max(np.abs(padded - got))))
    row["ref_max_abs"] = row["padded_vs_ref"]["ref_max_abs"]
    row["ok"] = all(row[k]["max_abs_diff"] <= OK_SHARE * row["ref_max_abs"]
                    for k in ("padded_vs_ref", "packed_vs_ref"))
    row["s"] = round(time.perf_counter() - t, 2)
    return row


def versions() -> dict:
    """jax's, jaxlib's and libtpu's versions (a Mosaic DMA bug was a libtpu regression:
    jax-ml/jax#39744, wrong from 0.0.43 on)."""
    from importlib import metadata

    out = {"jax": jax.__version__}
    for name in ("jaxlib", "libtpu", "libtpu-nightly"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def run(height: int = 480, width: int = 832, dtype: str = "bfloat16", widths=(96,),
        interpret: bool = False, seed: int = 0, config=None, with_decodes: bool = False,
        jit_options=None, jit_paths=()):
    """Yield the rows: the capture's, each kept call's (:func:`check`), then for each of
    ``jit_paths`` (``"packed"``, ``"fast"``) :func:`vae_capture_jit.jit_calls`' and
    (``with_decodes``) :func:`vae_capture_jit.decodes`' (``jit_options``: its ``options``).
    ``config``: :func:`vae_decode.build_vae`'s (None: full-size Wan 2.1)."""
    from ditax.models.vae.wan.layers import FastPath
    from vae_capture_jit import decodes, jit_calls

    t = time.perf_counter()
    vae = build_vae(dtype, seed, config=config)
    z = latents(vae, height, width, dtype, seed)
    case = {"bench": "vae_capture", "case": f"{height}x{width}x1 {dtype}",
            "device": jax.devices()[0].device_kind, "interpret": interpret}
    with captured(vae, set(widths)) as calls:
        frames = jax.block_until_ready(first_chunk(vae, z, FastPath(interpret=interpret)))
    kept = [c for c in calls if "args" in c]
    yield {**case, "kind": "capture", "calls": len(calls), "kept": len(kept),
           "widths": list(widths), "frame_shape": list(frames.shape),
           "frame_max_abs": float(jnp.max(jnp.abs(frames.astype(jnp.float32)))),
           "s": round(time.perf_counter() - t, 1),
           "versions": versions(),
           "all": [[c["index"], c["name"], c["cin"], c["cout"], c["epilogue"]] for c in calls]}
    for call in kept:
        yield {**case, "kind": "call", **check(call, interpret)}
        call.pop("args"), call.pop("out")   # free the device memory as we go
    for variant in jit_paths:
        for row in jit_calls(vae, z, frames, widths, interpret, variant):
            yield {**case, **row}
    if with_decodes:
        yield {**case, **decodes(vae, z, frames, widths, interpret, jit_options)}


def _option(value: str):
    """A compiler option's value from the command line: a bool, an int, or the string."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    try:
        return int(value)
    except ValueError:
        return value


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=832)
    ap.add_argument("--dtype", default="bfloat16",
                    help="float32 sets jax_default_matmul_precision=highest: the kernels' "
                         "float32 products follow it, the reference's are HIGHEST")
    ap.add_argument("--widths", default="96",
                    help="real input channels of the calls to keep and check (comma-separated)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interpret", action="store_true",
                    help="Pallas interpret mode on the CPU (use a small size: 64x64)")
    ap.add_argument("--decodes", action="store_true",
                    help="then the first chunk eager / jitted, fast / packed (two compiles)")
    ap.add_argument("--jit-calls", default="",
                    help="packed and/or fast (comma-separated): the first chunk jitted on that "
                         "path with the kept calls' inputs and outputs as its outputs, each "
                         "call checked as the program ran it")
    ap.add_argument("--jit-options", default="",
                    help="with --decodes: XLA compiler options (key=value,...) for one more "
                         "compile of the jitted packed first chunk")
    ap.add_argument("--out", default=None, help="also append the rows to this file")
    a = ap.parse_args(argv)
    if not a.interpret and jax.devices()[0].platform != "tpu":
        raise SystemExit(f"vae_capture runs the TPU kernels; this machine has "
                         f"{jax.devices()[0].platform}: use --interpret (and a small size)")
    if a.dtype == "float32":   # else one bf16 pass a product: not what the reference does
        jax.config.update("jax_default_matmul_precision", "highest")
    widths = tuple(int(c) for c in a.widths.split(","))
    options = {k: _option(v) for k, v in (kv.split("=", 1) for kv in a.jit_options.split(",")
                                           if kv)}
    for row in run(a.height, a.width, a.dtype, widths, a.interpret, a.seed,
                   with_decodes=a.decodes, jit_options=options or None,
                   jit_paths=[v for v in a.jit_calls.split(",") if v]):
        emit(row, a.out)


if __name__ == "__main__":
    main()
