"""Wan 2.1 VAE decode, measured: today's path next to the TPU fast path, one JSON line each.

Builds the real-size Wan 2.1 VAE (``WanVAEConfig()``: z_dim 16, base 96, dim_mult 1-2-4-4)
with random weights (biases and norm gains randomised too, ``conv_out`` scaled so that most
pixels stay inside the clip), decodes random latents of a ``--height`` x ``--width`` x
``--frames`` video and prints, per variant::

    {"bench": "vae_decode", "case": "480x832x81 bfloat16", "variant": "fast", "metric": "decode",
     "value": <median seconds>, "unit": "s", "compile_s": ..., "first_call_s": ..., "flops": ...,
     "bytes_accessed": ..., "programs": ..., "frames_per_chunk": ..., "peak_hbm_bytes": ...,
     "max_abs_diff": <vs the first variant, unclipped frames>, ...}

Variants (``--variants``, comma-separated): ``old`` (``path="plain"``, one latent frame a
chunk: the decode before the fast path), ``fast`` (``path="fast"`` with automatic chunking;
``"interpret"`` off a TPU), ``packed`` (``path="packed"``: the fast path with the kernels'
taps packed, :mod:`ditax.models.vae.wan.conv_tpu_pack`), ``packed@96`` / ``packed@96+192``
/ ``packed-nocols`` (its packing only where a kernel's real input channels are those; without
the column taps side by side: a restricted ``FastPath``, ``--bisect`` runs :data:`BISECT`),
``fast:N`` / ``packed:N`` / ``plain:N`` (N latent frames a chunk); a suffix
``/float32`` runs a variant on the same (``--dtype``-rounded) weights and latents in float32:
as the first variant (``--variants old/float32,old,fast``) it is the reference that both
bf16 decodes' ``max_abs_diff`` measure against (bf16 rounding alone moves frames by a few
hundredths; the fast path's differences from the old one are of that size). Each variant
runs in a fresh child process (``--timeout`` seconds at most), so ``compile_s`` is a cold
compile (``--cache DIR``: jax's persistent compilation cache there; ``--warm`` reruns each
variant once more to time the compile read back from it) and ``peak_hbm_bytes``
(``device.memory_stats()["peak_bytes_in_use"]``, null where a backend has none) is the
variant's own. Children write their unclipped frames (``.npy``) to a temporary folder; the
parent compares every variant with the first (``max_abs_diff``, and where:
:func:`frame_diffs`, per latent frame too, so an error in the first chunk alone shows).
``flops`` / ``bytes_accessed``: XLA's cost analysis of the compiled programs times their calls
(Pallas kernels report their own estimates).

``measure(height, width, frames, dtype, variant)`` runs one variant in this process and
returns the row (without ``max_abs_diff``). On a TPU v5e:
``python benchmarks/vae_decode.py --height 480 --width 832 --frames 81 --dtype bfloat16``;
on a CPU (``fast`` interprets its kernels: slow) ``--height 64 --width 64 --frames 9``.

``--memory tpu-v5e-1 [--chunks auto,1,2]`` decodes nothing: it compiles the fast path for that
target without a TPU (libtpu's deviceless compile, on a CPU host) and prints each program's
``memory_analysis()`` beside the automatic chunking's estimate (:func:`memory`;
``docs/vae_decode_memory_v5e.jsonl`` holds its rows for 480p and 720p x 81 frames).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np


def build_vae(dtype: str, seed: int = 0, values: str | None = None, config=None):
    """The Wan 2.1 VAE (``config``, default ``WanVAEConfig()``: full size) with random weights
    in ``dtype`` (rounded to ``values`` first: the same weights held in a wider type), a module
    of ``dtype``: ``vae.dtype`` is the latents' type its ``compile_decode`` compiles for and
    its layers' compute type. The weights are the float32 module's draws whatever ``dtype``
    is (drawn eagerly: a jitted draw fuses differently and moves some weights by an ulp)."""
    from flax import nnx

    from ditax.models.vae.wan import WanVAE, WanVAEConfig

    config = config or WanVAEConfig()
    state = nnx.state(WanVAE(config, dtype=jnp.float32, rngs=nnx.Rngs(seed)))
    leaves, tree = jax.tree_util.tree_flatten_with_path(state)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    out = []
    for (path, leaf), key in zip(leaves, keys):
        name = "/".join(str(p) for p in path)
        if "['bias']" in name:
            leaf = 0.05 * jax.random.normal(key, leaf.shape, leaf.dtype)
        elif "['gamma']" in name:
            leaf = 1.0 + 0.2 * jax.random.normal(key, leaf.shape, leaf.dtype)
        elif "['decoder']/['conv_out']/['weight']" in name:
            leaf = 0.3 * leaf
        out.append(leaf.astype(values or dtype).astype(dtype))
    graphdef = nnx.graphdef(nnx.eval_shape(
        lambda: WanVAE(config, dtype=jnp.dtype(dtype), rngs=nnx.Rngs(seed))))
    return nnx.merge(graphdef, jax.tree_util.tree_unflatten(tree, out))


#: ``--bisect``: the fast path, then the packed one whole and with its packing restricted to
#: one input width each — at 480x832: ``@16`` conv_in; ``@96`` the 480x832 level's six convs
#: and conv_out; ``@192`` the 192 → 384 conv at 120x208, the 240x416 level's six convs (column
#: taps side by side) and its upsampling (phases); ``@384`` the mid block, the 60x104 level, the
#: 120x208 level's 384 convs and both upsamplings from 384 — and without the column taps side
#: by side (``-nocols``): which part of a wrong packed decode is wrong
BISECT = "fast,packed,packed@16,packed@96,packed@192,packed@384,packed-nocols"


def _variant(name: str):
    """``old`` / ``fast`` / ``fast:N`` / ``packed`` / ``plain:N`` (a ``/dtype`` suffix aside) →
    (decode path, latent frames a chunk). ``packed@96`` / ``packed@96+192`` (packing only
    where a kernel's real input channels are those) and ``packed-nocols`` (no column taps side
    by side), combinable (``packed-nocols@192``), give a restricted ``FastPath``."""
    base, _, n = name.split("/")[0].partition(":")
    frames = int(n) if n else None
    tpu = jax.devices()[0].platform == "tpu"
    if base == "old":
        return "plain", frames or 1
    if base in ("fast", "packed"):
        return {("fast", True): "fast", ("fast", False): "interpret", ("packed", True): "packed",
                ("packed", False): "interpret-packed"}[base, tpu], frames
    if base == "plain":
        return "plain", frames
    head, _, only = base.partition("@")
    if head in ("packed", "packed-nocols") and base != "packed":
        from ditax.models.vae.wan.layers import FastPath

        try:
            widths = tuple(int(c) for c in only.split("+")) if only else None
        except ValueError:
            widths = ()
        if widths != ():
            return FastPath(interpret=not tpu, pack=True, only=widths,
                            columns=head == "packed"), frames
    raise SystemExit(f"unknown variant {name!r}: use old, fast, fast:N, packed, packed:N, "
                     "packed@C[+C...], packed-nocols[@C...], plain:N")


def _path_name(path) -> str:
    """A decode path for a JSON row: its name, or a restricted ``FastPath``'s fields."""
    if isinstance(path, str):
        return path
    return ("interpret-" if path.interpret else "") + "packed" + (
        "" if path.columns else "-nocols") + (
        "" if path.only is None else "@" + "+".join(map(str, path.only)))


def frame_diffs(frames: np.ndarray, reference: np.ndarray, temporal: int = 4) -> dict:
    """Where ``frames`` (unclipped, channels-last ``[B, F, H, W, c]``) differ from
    ``reference``: the largest difference's place (``[frame, row, column, channel]``), the
    mean difference, the share of values off by more than 0.1, and the largest per latent
    frame (``max_abs_diff_by_latent``: frame 0, then each ``temporal`` frames; a decode chunk
    of N latent frames spans N entries)."""
    diff = np.abs(frames.astype(np.float32) - reference.astype(np.float32)).max(axis=0)
    at = np.unravel_index(int(np.argmax(diff)), diff.shape)
    per_frame = diff.reshape(diff.shape[0], -1).max(axis=1)
    latent = [per_frame[:1].max()] + [per_frame[i:i + temporal].max()
                                      for i in range(1, len(per_frame), temporal)]
    return {"max_abs_diff_at": [int(i) for i in at],
            "mean_abs_diff": float(diff.mean()), "share_over_0.1": float((diff > 0.1).mean()),
            "max_abs_diff_by_latent": [round(float(v), 4) for v in latent]}


def _cost(compiled) -> tuple[float, float]:
    ca = compiled.cost_analysis()
    ca = (ca[0] if ca else {}) if isinstance(ca, (list, tuple)) else (ca or {})
    return float(ca.get("flops", 0.0) or 0.0), float(ca.get("bytes accessed", 0.0) or 0.0)


def measure(height: int, width: int, frames: int, dtype: str = "bfloat16", variant: str = "fast",
            repeats: int = 3, seed: int = 0, save: str | None = None, config=None,
            profile: bool = False) -> dict:
    """One variant's row: compile (timed), one first call, ``repeats`` timed decodes
    (``config``: :func:`build_vae`'s, the full-size VAE by default); ``profile``: then one
    more decode under the profiler, its device ops summed (``chip_profile.op_breakdown``:
    the convolution kernels against XLA's own ops) in the row's ``profile``."""
    t_start = time.perf_counter()
    path, chunk = _variant(variant)
    wide = variant.partition("/")[2]   # "old/float32": the same values, computed wider
    run_dtype = wide or dtype
    if wide:   # a reference: full float32 products (a TPU's default is one bf16 pass), one run
        jax.config.update("jax_default_matmul_precision", "highest")
        repeats = 1
    vae = build_vae(run_dtype, seed, values=dtype, config=config)
    cfg = vae.config
    f_lat, y, x = cfg.latent_grid(frames, height, width)
    z = jax.random.normal(jax.random.key(seed + 7), (1, cfg.z_dim, f_lat, y, x), jnp.float32)
    z = z.astype(dtype).astype(run_dtype)
    jax.block_until_ready((z, jax.tree.leaves(vae)))
    t = time.perf_counter()
    programs = vae.compile_decode(z.shape, path=path, frames_per_chunk=chunk)
    compile_s = time.perf_counter() - t
    later = f_lat - 1
    calls = [(programs.first, 1)] + ([(programs.rest, -(-later // programs.frames))] if later else [])
    flops = sum(_cost(p)[0] * n for p, n in calls)
    nbytes = sum(_cost(p)[1] * n for p, n in calls)
    temp = max(int(p.memory_analysis().temp_size_in_bytes) for p, _ in calls)

    latents = jnp.transpose(z, (0, 2, 3, 4, 1))
    run = lambda: vae._decode_frames(latents, programs)  # noqa: E731  (unclipped frames)
    t = time.perf_counter()
    video = jax.block_until_ready(run())
    first_call_s = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(run())
        times.append(time.perf_counter() - t)
    if save:
        np.save(save, np.asarray(video.astype(jnp.float32)))
    prof = None
    if profile:
        from chip_profile import op_breakdown

        prof = op_breakdown(lambda: jax.block_until_ready(run()))
    estimate = None
    if path != "plain":   # the later chunk's estimated memory, as the automatic chunking sees it
        lat = (1, f_lat, y, x, cfg.z_dim)
        estimate = vae.chunk_memory(lat, programs.cache).bytes(programs.frames)
    stats = jax.devices()[0].memory_stats() or {}
    return {"bench": "vae_decode", "case": f"{height}x{width}x{frames} {dtype}",
            "variant": variant, "path": _path_name(path), "dtype": run_dtype, "metric": "decode",
            "value": round(statistics.median(times), 4), "unit": "s",
            "times_s": [round(v, 4) for v in times], "compile_s": round(compile_s, 2),
            "first_call_s": round(first_call_s, 3), "flops": flops, "bytes_accessed": nbytes,
            "compute_floor_s": round(flops / 197e12, 4), "hbm_floor_s": round(nbytes / 819e9, 4),
            "programs": sum(n for _, n in calls), "frames_per_chunk": programs.frames,
            "program_temp_bytes": temp, "peak_hbm_bytes": stats.get("peak_bytes_in_use"),
            "chunk_estimate_bytes": estimate,
            "device": jax.devices()[0].device_kind, "wall_s": round(time.perf_counter() - t_start, 1),
            **({"profile": prof} if profile else {})}


def _memory_row(name: str, compiled) -> dict:
    m = compiled.memory_analysis()
    row = {"program": name, "temp_bytes": int(m.temp_size_in_bytes),
           "argument_bytes": int(m.argument_size_in_bytes),
           "output_bytes": int(m.output_size_in_bytes), "alias_bytes": int(m.alias_size_in_bytes)}
    row["peak_bytes"] = (row["argument_bytes"] + row["temp_bytes"] + row["output_bytes"]
                         - row["alias_bytes"])
    row["temp_gib"], row["peak_gib"] = (round(row[k] / 2**30, 3) for k in ("temp_bytes",
                                                                          "peak_bytes"))
    return row


def memory(height: int, width: int, frames: int, dtype: str = "bfloat16",
           chunks=(None,), target: str = "tpu-v5e-1", path: str = "fast") -> list[dict]:
    """What a deviceless compile for ``target`` says of the fast path's (``path``: ``"fast"``
    or ``"packed"``) two programs
    (``compiled.memory_analysis()``; ``peak_bytes``: arguments + temporaries + outputs - the
    outputs aliased to donated arguments, the feature cache) for each latent-frames-a-chunk in
    ``chunks`` (None: the automatic choice), beside the later chunk's estimate
    (``WanVAE.chunk_memory``) and the budget it is chosen under. Needs libtpu, no TPU."""
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import ditax
    from ditax.models.vae.wan import WanVAE, WanVAEConfig
    from ditax.models.vae.wan.chunks import memory_budget
    from ditax.plan.targets import parse_target, topology_devices

    device = topology_devices(parse_target(target))[0]
    placed = NamedSharding(Mesh([device], ("d",)), PartitionSpec())
    graphdef, state = nnx.split(nnx.eval_shape(
        lambda: WanVAE(WanVAEConfig(), dtype=jnp.dtype(dtype), rngs=nnx.Rngs(0))))
    vae = nnx.merge(graphdef, jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=placed), state))
    f_lat, y, x = vae.config.latent_grid(frames, height, width)
    rows = []
    case = {"bench": "vae_decode_memory", "case": f"{height}x{width}x{frames} {dtype}",
            "target": target, "device": device.device_kind, "path": path}
    for n in chunks:
        t = time.perf_counter()
        try:
            with ditax.target_platform("tpu", device_kind=device.device_kind):
                programs = vae.compile_decode((1, vae.z_dim, f_lat, y, x), placed, path=path,
                                              frames_per_chunk=n)
        except Exception as e:   # e.g. RESOURCE_EXHAUSTED: the temporaries exceed the HBM
            rows.append({**case, "frames_per_chunk": n, "auto": n is None,
                         "error": str(e).splitlines()[0][:300]})
            continue
        estimate = vae.chunk_memory((1, f_lat, y, x, vae.z_dim), programs.cache)
        for name, compiled in (("first", programs.first), ("rest", programs.rest)):
            rows.append({**case, "frames_per_chunk": programs.frames, "auto": n is None,
                         **_memory_row(name, compiled),
                         "estimate_bytes": estimate.bytes(programs.frames) if name == "rest"
                         else None, "budget_bytes": memory_budget(device),
                         "compile_s": round(time.perf_counter() - t, 1)})
    return rows


def _child(args, variant: str, out: str, cache: str | None) -> dict:
    """Run one variant in a fresh process (bounded by ``args.timeout``); its JSON row."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--save", out,
           "--height", str(args.height), "--width", str(args.width), "--frames", str(args.frames),
           "--dtype", args.dtype, "--repeats", str(args.repeats)] + (
               ["--profile"] if args.profile else [])
    for flag, value in (("--block-elems", args.block_elems), ("--mxu-rows", args.mxu_rows)):
        if value:
            cmd += [flag, str(value)]
    env = dict(os.environ)
    if cache:
        env["JAX_COMPILATION_CACHE_DIR"] = cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    case = f"{args.height}x{args.width}x{args.frames} {args.dtype}"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"bench": "vae_decode", "case": case, "variant": variant,
                "error": f"timed out after {args.timeout} s"}
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not rows:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"bench": "vae_decode", "case": case, "variant": variant,
                "error": f"exit {done.returncode}: {' | '.join(tail)[:600]}"}
    return json.loads(rows[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=832)
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--variants", default="old,fast")
    ap.add_argument("--bisect", action="store_true",
                    help=f"the variants {BISECT}: which part of the packed path differs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true",
                    help="each variant's row also holds one decode's device-op profile")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per variant process")
    ap.add_argument("--block-elems", type=int, default=None,
                    help="the fast path's kernel block size (rows * X * C per step; "
                         "conv_tpu._TARGET_ELEMS, default 2^20) in every variant")
    ap.add_argument("--mxu-rows", type=int, default=None,
                    help="pixels per MXU product in the fast path's kernels "
                         "(conv_tpu._MXU_ROWS, default 2048; larger compiles slower)")
    ap.add_argument("--cache", default=None, help="persistent compilation cache folder")
    ap.add_argument("--warm", action="store_true", help="rerun each variant with --cache filled")
    ap.add_argument("--memory", default=None, metavar="TARGET",
                    help="instead of decoding: compile the fast path deviceless for TARGET "
                         "(e.g. tpu-v5e-1) and print its programs' memory (see memory())")
    ap.add_argument("--chunks", default="auto",
                    help="with --memory: latent frames a chunk, comma-separated (auto: the "
                         "automatic choice)")
    ap.add_argument("--path", default="fast", choices=("fast", "packed"),
                    help="with --memory: the fast path, or it with the kernels' taps packed")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.bisect:
        args.variants = BISECT
    from ditax.models.vae.wan import conv_tpu

    if args.block_elems:
        conv_tpu._TARGET_ELEMS = args.block_elems
    if args.mxu_rows:
        conv_tpu._MXU_ROWS = args.mxu_rows
    if args.memory:
        chunks = [None if c == "auto" else int(c) for c in args.chunks.split(",")]
        for row in memory(args.height, args.width, args.frames, args.dtype, chunks, args.memory,
                          args.path):
            print(json.dumps(row), flush=True)
        return
    if args.child:
        row = measure(args.height, args.width, args.frames, args.dtype, args.child,
                      args.repeats, save=args.save, profile=args.profile)
        row["block_elems"] = conv_tpu._TARGET_ELEMS
        row["mxu_rows"] = conv_tpu._MXU_ROWS
        print(json.dumps(row), flush=True)
        return
    if args.warm and not args.cache:
        args.cache = tempfile.mkdtemp(prefix="vae_decode_cache_")
    with tempfile.TemporaryDirectory(prefix="vae_decode_") as tmp:
        reference = ref_value = None
        for i, variant in enumerate(v.strip() for v in args.variants.split(",") if v.strip()):
            out = os.path.join(tmp, f"v{i}.npy")
            row = _child(args, variant, out, args.cache)
            if "error" not in row and os.path.exists(out):
                frames = np.load(out)
                if reference is None:
                    reference, ref_value, row["reference"] = frames, row["value"], True
                else:
                    row["max_abs_diff"] = float(np.max(np.abs(frames - reference)))
                    row["max_abs_diff_clipped"] = float(np.max(np.abs(
                        np.clip(frames, -1, 1) - np.clip(reference, -1, 1))))
                    row["speedup"] = round(ref_value / row["value"], 3)
                    if frames.shape == reference.shape:
                        row.update(frame_diffs(frames, reference))
                os.remove(out)
            print(json.dumps(row), flush=True)
            if args.warm and "error" not in row:
                warm = _child(args, variant, out, args.cache)
                warm["metric"] = "decode_warm_cache"
                print(json.dumps(warm), flush=True)


if __name__ == "__main__":
    main()
