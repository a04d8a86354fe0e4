"""``ditax plan CONFIG [key=value ...] [--target tpu-v6e-8 | cpu:N] [--compile] [--train]
[--json] [--dump-hlo FILE]``: mesh, parameter shardings, and the compiled programs' per-device
memory, relayout copies, FLOPs, collective bytes and roofline time. On a TPU target the memory
is also the device peak a chip shows (buffers + temporaries, :func:`ditax.plan.measure.
device_peak`) against the chip's limit; a forward that does not fit names the change that
makes it fit (:func:`ditax.plan.fit.suggestion`: ``--fit``'s ladder). ``--fit`` (one-chip
targets): what fits the chip, phase by phase, and the smallest change that does
(:mod:`ditax.plan.fit`).

Nothing is allocated (:func:`ditax.plan.plan`). ``--target tpu-v6e-8`` compiles for that TPU
slice without a TPU (deviceless, through libtpu: ``pip install "jax[tpu]==<jax version>"``);
``--target cpu:N`` (or ``--devices N``) plans for N CPU devices: when JAX has not started yet
(the ``ditax`` command), this process's JAX is set up with N simulated CPU devices before it
starts. The mesh is always built from the target's devices, so the platform is chosen through
the mesh and never by changing the environment of a running JAX. Compiles go through jax's
persistent compilation cache (:mod:`ditax.compile_cache`; ``compile_cache=PATH|none``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ditax.cli import latent_arg
from ditax.errors import RequestError

GIB = 2 ** 30


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("config", help="preset name (tiny, wan2.1-t2v-1.3b, ...) or YAML path")
    p.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. mesh.context=8")
    p.add_argument("--target", default=None,
                   help="tpu-v6e-8, tpu-v5e-8, tpu-v5p-8, tpu-v6e-16, ... (deviceless TPU "
                        "compile; needs libtpu) or cpu:N (N simulated CPU devices)")
    p.add_argument("--devices", type=int, default=None, help="same as --target cpu:N")
    p.add_argument("--latent", type=latent_arg, default=None,
                   help="latent F,Y,X for --compile (default: from sample.* of the config)")
    p.add_argument("--compile", action="store_true", help="also compile the forward abstractly")
    p.add_argument("--train", action="store_true",
                   help="also compile one training step (batch_size, data.* sizes, remat)")
    p.add_argument("--dump-hlo", default=None, metavar="FILE",
                   help="write the compiled forward's HLO text to FILE (implies --compile)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    f = p.add_argument_group(
        "fit (single-chip targets: tpu-v5e-1, tpu-v6e-1, tpu-v5p-1)",
        "--fit reports, per phase of the pipeline (text encoding, one denoising step, the VAE "
        "decode), the bytes on the chip next to its HBM with what the other phases leave "
        "resident, the host->device bytes a step streams under model.offload=host and their "
        "time at an ASSUMED 32 GB/s host link next to the step's compute time, and the "
        "smallest change that fits, tried in order: model.offload=host, + model.quantize="
        "int8, + text_quantize=int8, else more chips / a tiled or parallel decode. Measured: "
        "the compiled denoise forward (deviceless) and the compiled VAE decode of one latent "
        "frame; analytic: the text encoder (published config) and any layer scaling.")
    f.add_argument("--fit", action="store_true", help="report what fits one chip (see above)")
    f.add_argument("--fit-layers", type=int, default=None, metavar="N",
                   help="compile N transformer layers and scale to model.num_layers (rarely "
                        "needed: the layer loop is scanned, and all 40 layers of Wan 14B at "
                        "720p compile in about a minute, as 2 do)")
    f.add_argument("--fit-all", action="store_true",
                   help="compile every rung of the ladder, not only until everything fits")
    f.add_argument("--fit-no-decode", action="store_true",
                   help="skip the VAE decode compile (reported as not measured)")
    f.add_argument("--text-offload", choices=("none", "host"), default=None,
                   help="the text encoders' weights in host memory (default: model.offload)")
    f.add_argument("--text-quantize", choices=("none", "int8", "fp8"), default="none",
                   help="the text encoders' block linears in 8 bits")


def simulated_cpu_devices(n: int) -> list:
    """N CPU devices for the mesh. If JAX has not started, it is first told to start with (at
    least) N host devices on the CPU platform; if it has, the CPU devices it has must do."""
    if n < 1:
        raise RequestError(f"--devices={n} must be >= 1")
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={n}").strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    devices = jax.devices("cpu")
    if len(devices) < n:
        raise RequestError(f"--devices={n}: JAX already started in this process with "
                           f"{len(devices)} CPU device(s); run `ditax plan` as its own command "
                           f"(it sets up N CPU devices before JAX starts)")
    return devices[:n]


def target_devices(args):
    """``(devices, chip)`` for ``--target`` / ``--devices`` (None devices: ``jax.devices()``)."""
    from ditax.plan.targets import parse_target, topology_devices

    if args.target is not None and args.devices is not None:
        raise RequestError("give --target or --devices, not both (--devices N = --target cpu:N)")
    if args.devices is not None:
        return simulated_cpu_devices(args.devices), None
    if args.target is None:
        return None, None
    target = parse_target(args.target)
    if target.kind == "cpu":
        return simulated_cpu_devices(target.num_devices), None
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")   # this host's own backend: CPU is enough
    return topology_devices(target), target.chip


def run(args) -> int:
    if args.dump_hlo is not None:       # before anything compiles
        from ditax.io.outputs import check_output_file

        check_output_file(args.dump_hlo, "--dump-hlo", "forward.hlo.txt")
    devices, chip = target_devices(args)
    import jax

    from ditax.front.run import run_context
    from ditax.models.common.fields import matmul_precision
    from ditax.config import load_config, validate
    from ditax.config.families import check_capabilities
    from ditax.parallel import make_mesh
    from ditax.plan import plan

    devices = jax.devices() if devices is None else devices
    cfg = load_config(args.config, args.overrides)
    check_capabilities(cfg, "ditax plan", training=args.train)
    validate(cfg, len(devices), training=args.train)
    if args.compile or args.dump_hlo is not None or getattr(args, "fit", False):
        check_sizes(cfg, args.latent)
    mesh = make_mesh(cfg.mesh, devices)
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print  # noqa: E731
    if getattr(args, "fit", False):
        return _run_fit(args, cfg, mesh, chip, say)
    with run_context(cfg.attention, mesh, compile_cache=cfg.compile_cache, say=say,
                     precision=matmul_precision(cfg.model)):
        out = plan(cfg, mesh, args.latent, args.compile or args.dump_hlo is not None,
                   train=args.train, chip=chip, hlo_path=args.dump_hlo)
    if args.target is not None:
        out["target"] = args.target
    fwd = out.get("forward", {})
    if fwd.get("fits") is False:          # the change that makes it fit (--fit's ladder)
        from ditax.plan.fit import suggestion

        fwd["suggestion"] = suggestion(cfg, chip, fwd.get("device_peak_bytes",
                                                          out["param_bytes_per_device"]))
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"config {cfg.name}: mesh {out['mesh']} on {len(devices)} {devices[0].platform} "
          f"devices" + (f" ({args.target}, {chip.name})" if chip is not None else ""))
    print(f"parameters: {out['params'] / 1e9:.3f} B, {out['param_bytes_total'] / GIB:.2f} GiB "
          f"total, {out['param_bytes_per_device'] / GIB:.3f} GiB per device")
    if out.get("sparsity"):
        print(sparsity_line(out["sparsity"]))
    seen = set()
    for name, shape, spec in out["shardings"]:
        key = (name.split(".")[-1], spec)
        if key in seen:
            continue
        seen.add(key)
        print(f"  {name:45s} {str(shape):24s} {spec}")
    for key, what in (("forward", "latent"), ("train_step", "latents")):
        if key in out:
            _print_program(key, out[key], what)
    return 0


def check_sizes(cfg, latent) -> None:
    """What the plan compiles on the family's one size rule
    (:meth:`~ditax.models.base.ModelFamily.size_rule` of the config's model), before anything
    compiles: ``--latent F,Y,X`` on its latent grid (its patch), else ``sample.*``'s sizes and
    frames; one :class:`~ditax.errors.ConfigError` line with the nearest valid values."""
    from ditax.models.base import model_family

    family = model_family(cfg.model)
    if latent is not None:
        family.check_latents((family.latent_channels, *latent), f"--latent {latent_str(latent)}",
                             say=lambda near: f"use --latent {latent_str(near[-3:])}")
    else:
        s = cfg.sample
        family.check_size(s.num_frames, s.height, s.width, names="sample")


def sparsity_line(s: dict) -> str:
    """``attention.sparsity``'s layout in one line: the tile (and whether ``auto`` chose it),
    the tokens padded to whole tiles, the share of scores computed."""
    x = "x".join
    return (f"sparsity {s['mode']}: {x(map(str, s['grid']))} tokens in {x(map(str, s['tile']))} "
            f"tiles ({s['tile_len']} tokens{', attention.tile=auto' if s['tile_auto'] else ''}"
            f"): {s['padded_tokens']:,} tokens for {s['tokens']:,} (+{100 * s['padding']:.1f}% "
            f"padding), {100 * s['density']:.1f}% of the scores")


def latent_str(latent) -> str:
    return ",".join(map(str, latent))


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2 ** 20:.2f} MiB"


def _print_program(name: str, p: dict, what: str) -> None:
    mib = 2 ** 20
    if "error" in p:
        print(f"{name} {what} {p[what]}: does NOT fit: {p['error']}")
        if "suggestion" in p:
            print(f"  to fit: {p['suggestion']}")
    else:
        print(f"{name} {what} {p[what]} (compiled in {p['compile_s']:.1f} s), per device:")
    if "bucket" in p:
        print(f"  the dataset's largest bucket, {p['bucket']} (of {', '.join(p['buckets'])}; "
              f"each compiles its own step)")
    if "distill" in p:
        d = p["distill"]
        kind = f"LoRA rank {d['lora_rank']}" if d["lora_rank"] else "full weights"
        print(f"  distill {d['method']}: {d['steps']}-step student ({kind}), "
              f"{d['critic_updates']} critic updates a step, teacher guidance "
              f"{d['guidance']:g}; {d['flops_factor']:.2f}x a training step's transformer work")
    if "state_bytes_per_device" in p:
        print("  state: " + ", ".join(f"{k} {_size(v)}" for k, v in
                                      p["state_bytes_per_device"].items() if v >= 1024))
    if "error" in p:
        return
    print(f"  memory: arguments {p['argument_bytes'] / GIB:.2f} GiB, temp "
          f"{p['temp_bytes'] / GIB:.2f} GiB, output {p['output_bytes'] / GIB:.2f} GiB, peak "
          f"{p['peak_bytes'] / GIB:.2f} GiB (XLA's heap peak)")
    if "fits" in p:
        print("  " + device_peak_line(p))
    print(f"  relayout copies: {p['copy_ops']} ops, {p['copy_bytes'] / mib:.1f} MiB (fused "
          f"into compute: {p['fused_copy_ops']} ops, {p['fused_copy_bytes'] / mib:.1f} MiB); "
          f"next to {p['all_to_all_ops']} all-to-alls: {p['a2a_copy_ops']} ops, "
          f"{p['a2a_copy_bytes'] / mib:.1f} MiB")
    if p.get("per_layer"):
        lay = p["per_layer"]
        print(f"  per layer: {lay['copy_ops']} copies, {lay['copy_bytes'] / mib:.1f} MiB; "
              f"{lay['a2a_copy_ops']} next to all-to-alls, {lay['a2a_copy_bytes'] / mib:.1f} MiB")
    coll = ", ".join(f"{k} {v / mib:.1f} MiB" for k, v in sorted(p["collective_bytes"].items()))
    print(f"  FLOPs {p['flops']:.3e} (model {p['model_flops']:.3e}, XLA matmuls "
          f"{p['xla_flops']:.3e}); Mosaic kernels {p['tpu_custom_calls']}; collectives: "
          f"{coll or 'none'}")
    if "roofline" in p:
        r = p["roofline"]
        print(f"  roofline on {r['chip']}: {r['estimate_s'] * 1e3:.1f} ms ({r['bound']}-bound; "
              f"compute {r['compute_s'] * 1e3:.1f} ms, HBM {r['hbm_s'] * 1e3:.1f} ms, ICI "
              f"{r['ici_s'] * 1e3:.1f} ms)")


def device_peak_line(p: dict) -> str:
    """The chip-comparable memory of a compiled program (:func:`ditax.plan.measure.
    device_peak`) against the chip's limit, with the change that fits where it does not."""
    verdict = "fits" if p["fits"] else "does NOT fit" + (
        f"; to fit: {p['suggestion']}" if "suggestion" in p else "")
    return (f"on the chip: buffers {p['device_buffer_bytes'] / GIB:.2f} GiB (arguments + "
            f"outputs - aliased + code: memory_stats' peak_bytes_in_use) + temporaries "
            f"{p['device_temp_bytes'] / GIB:.2f} GiB (peak_bytes_reserved) = device peak "
            f"{p['device_peak_bytes'] / GIB:.2f} GiB of {p['hbm_capacity_bytes'] / GIB:.2f} "
            f"GiB: {verdict}")


def _run_fit(args, cfg, mesh, chip, say) -> int:
    """``--fit``: :func:`ditax.plan.fit.fit` printed as a table (or ``--json``)."""
    from ditax.front.run import run_context
    from ditax.models.common.fields import matmul_precision
    from ditax.plan.fit import fit

    if chip is None or mesh.size != 1:
        raise RequestError("--fit plans one TPU chip: give --target tpu-v5e-1, tpu-v6e-1 or "
                           "tpu-v5p-1")
    with run_context(cfg.attention, mesh, compile_cache=cfg.compile_cache, say=say,
                     precision=matmul_precision(cfg.model)):
        out = fit(cfg, mesh, chip, latent=args.latent, layers=args.fit_layers,
                  text_offload=args.text_offload, text_quantize=args.text_quantize,
                  decode_=not args.fit_no_decode, every_rung=args.fit_all, say=say)
    out = {"config": cfg.name, "target": args.target, **out}
    if args.json:
        print(json.dumps(out))
        return 0
    print(fit_table(out))
    return 0


def fit_table(out: dict) -> str:
    """The ``--fit`` report as text: one block per rung, then the verdict per phase."""
    def g(n):
        if n is None:
            return "-"
        return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"

    lines = [f"{out['config']} on {out['target']} ({out['chip']}, {g(out['hbm_bytes'])} "
             f"usable: each phase's buffers + temporaries against it); "
             f"batch {out['batch']} a step, {out['experts']} transformer(s) held"
             + (f"; {out['compiled_layers']} of {out['layers']} layers compiled, scaled"
                if out["compiled_layers"] != out["layers"] else ""),
             f"  measured: {out['measured']}", f"  analytic: {out['analytic']}"]
    for r in out["rungs"]:
        lines.append(f"{r['changes']} (offload={r['offload']} quantize={r['quantize']} "
                     f"text_offload={r['text_offload']} text_quantize={r['text_quantize']}):")
        for phase in ("text", "denoise", "decode"):
            if phase in r:
                ok = "fits" if r[phase]["fits"] else "does NOT fit"
                lines.append(f"  {phase:8s} {g(r[phase].get('bytes')):>9s}  {ok}"
                             + (f" ({r[phase]['error']})" if "error" in r[phase] else ""))
        d = r["denoise"]["step"]
        if "host_s" in d:
            lines.append(f"  step: host->device {g(d['host_to_device_bytes'])} "
                         f"({d['host_s'] * 1e3:.0f} ms at 32 GB/s) vs compute "
                         f"{d['compute_s'] * 1e3:.0f} ms: ratio {d['host_over_compute']:.3f}, "
                         f"step {d['step_s_overlapped']:.2f} s overlapped .. "
                         f"{d['step_s_serial']:.2f} s serial; "
                         f"host holds {g(d['host_argument_bytes'] * out['experts'])}")
        if not d.get("streams_each_layer_once", True):
            lines.append("  WARNING: the program copies more than each offloaded layer once a "
                         "step" + (f"; layer scaling {d['scaling']}" if "scaling" in d else ""))
    for phase, v in out["verdict"].items():
        lines.append(f"{phase:8s}: {v['suggestion']}")
    return "\n".join(lines)
