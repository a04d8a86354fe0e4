"""Pipeline benchmark (CPU, float32), one JSON object per line.

1. Per-phase seconds of ditax vs diffusers' WanPipeline in the same run, on the same
   small-but-not-trivial random pipeline folder (the ``make demo`` folder: D=128 transformer,
   16-channel VAE, 64-wide UMT5): load, text, denoise, decode. ditax is timed twice: the first
   call (includes XLA compilation) and a second, warm call.
2. VAE decode memory vs number of frames: XLA's compiled memory analysis of the per-latent-frame
   decode step (arguments + temporaries + outputs) and the size of the decoded video; the step's
   working set must not grow with the frame count.
3. ``--cases i2v,ti2v``: the same per-phase comparison (plus ``image``: VAE encode of the
   condition, CLIP) for image-to-video on the tests' tiny random folders (Wan 2.1 I2V with CLIP;
   Wan 2.2 TI2V with an image) against diffusers' WanImageToVideoPipeline.
4. ``--cases vace,v2v,animate``: control, on the tests' tiny random folders, against diffusers'
   WanVACEPipeline (two experts; control video + mask + a reference image, scale 0.5; the same
   initial latents), WanVideoToVideoPipeline (strength 0.6) and WanAnimatePipeline (two
   segments; the same noise per segment, diffusers' draws replaced by ditax's). Phases:
   ``image`` is the condition (every VAE encode of control / source / reference / pose frames,
   CLIP); diffusers' are timed around its ``encode_prompt``, ``encode_image``, ``vae.encode``
   and ``vae.decode``, its denoise is the rest of the call.

    python benchmarks/pipeline.py [--steps 8] [--height 64] [--width 96] [--frames 17]
                                  [--cases t2v,i2v,ti2v,vace,v2v,animate]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DITAX_CACHE_DIR", "none")   # a cold first call (benchmarks/speed.py: cache)


def emit(**kw):
    print(json.dumps(kw), flush=True)


def phase_timer(spent: dict):
    """``timed(fn, name)``: ``fn`` wrapped so that its wall time adds to ``spent[name]`` (a
    reference pipeline's phases: its text encoder, VAE decode, ... methods replaced by these)."""
    def timed(fn, name):
        def wrap(*a, **k):
            s = time.perf_counter()
            out = fn(*a, **k)
            spent[name] += time.perf_counter() - s
            return out
        return wrap
    return timed

def bench_phases(folder, args, case="t2v", ref_cls="WanPipeline", image=None,
                 ref_image=None):
    """Per-phase seconds of ditax (cold, warm) vs diffusers' ``ref_cls`` loaded from the same
    folder; ``image`` for the ditax call, ``ref_image`` (default ``image``) for diffusers'."""
    import jax
    import numpy as np

    import ditax

    req = dict(prompt="a cat walks on the grass in the sun", negative_prompt="blurry",
               height=args.height, width=args.width, num_frames=args.frames,
               num_inference_steps=args.steps, guidance_scale=5.0)
    given = {} if image is None else {"image": image}
    t0 = time.perf_counter()
    pipe = ditax.load_pipeline(folder)
    t_load = time.perf_counter() - t0
    lat = np.random.default_rng(0).standard_normal(
        pipe.latent_shape(args.height, args.width, args.frames)).astype(np.float32)
    pipe(latents=lat, progress=False, **req, **given)
    cold = pipe.timings
    video = pipe(latents=lat, progress=False, **req, **given)
    warm = pipe.timings

    import diffusers
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    ref = getattr(diffusers, ref_cls).from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    d_load = time.perf_counter() - t0
    spent = {"text": 0.0, "decode": 0.0, "image": 0.0}

    timed = phase_timer(spent)
    ref.encode_prompt = timed(ref.encode_prompt, "text")
    ref.vae.decode = timed(ref.vae.decode, "decode")
    if image is not None:   # the condition: CLIP (Wan 2.1) and the VAE encode in prepare_latents
        ref.prepare_latents = timed(ref.prepare_latents, "image")
        if getattr(ref, "image_encoder", None) is not None:
            ref.encode_image = timed(ref.encode_image, "image")
    ref_given = {} if image is None else {"image": image if ref_image is None else ref_image}
    with torch.no_grad():
        s = time.perf_counter()
        out = ref(latents=torch.from_numpy(lat), output_type="np", **req, **ref_given).frames[0]
        total = time.perf_counter() - s
    d = {"load": d_load, "text": spent["text"], "decode": spent["decode"], "image": spent["image"],
         "denoise": total - spent["text"] - spent["decode"] - spent["image"]}
    shape = f"{case} {args.frames}x{args.height}x{args.width}, {args.steps} steps, CFG"
    phases = ("load", "text", "image", "denoise", "decode") if image is not None else (
        "load", "text", "denoise", "decode")
    for phase in phases:
        ours_warm = t_load if phase == "load" else getattr(warm, phase)
        ours_cold = t_load if phase == "load" else getattr(cold, phase)
        emit(bench="pipeline", case=shape, metric=f"{phase}_s", value=round(ours_warm, 4),
             cold=round(ours_cold, 4), unit="s", baseline=round(d[phase], 4),
             ratio=round(d[phase] / max(ours_warm, 1e-9), 3), baseline_name="diffusers (torch CPU)")
    emit(bench="pipeline", case=shape, metric="compile_s", value=round(cold.compile, 4),
         unit="s", note="first call's ahead-of-time compile (step + decode); 0 when warm")
    emit(bench="pipeline", case=shape, metric="max_abs_diff_vs_diffusers",
         value=float(np.abs(video - out).max()), unit="")
    del jax


def bench_vae_memory(folder, args):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from ditax.models.vae.wan.chunks import decode_chunk
    from ditax.models.vae.wan.convert import load_vae

    vae = load_vae(pathlib.Path(folder) / "vae")
    gdef, state = nnx.split(vae)
    tf, sf = vae.scale_factor_temporal, vae.scale_factor_spatial
    y, x = args.height // sf, args.width // sf
    for lat_frames in (1, 3, 5, 9, 17):
        z = jnp.zeros((1, lat_frames, y, x, vae.z_dim), jnp.float32)
        first = decode_chunk.lower(gdef, state, z[:, :1], None, first=True).compile()
        _, cache = decode_chunk(gdef, state, z[:, :1], None, first=True)
        peaks = []
        for c in (first,) + ((decode_chunk.lower(gdef, state, z[:, 1:2], cache,
                                                 first=False).compile(),)
                             if lat_frames > 1 else ()):
            m = c.memory_analysis()
            peaks.append(m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes)
        frames = 1 + tf * (lat_frames - 1)
        video_bytes = frames * args.height * args.width * 3 * 4
        emit(bench="vae_decode_memory", case=f"{frames} frames {args.height}x{args.width}",
             metric="step_peak_bytes", value=int(max(peaks)), unit="B",
             video_bytes=video_bytes, total_bytes=int(max(peaks)) + video_bytes)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--width", type=int, default=96)
    p.add_argument("--frames", type=int, default=17)
    p.add_argument("--folder", default=None, help="pipeline folder (default: build the demo one)")
    p.add_argument("--cases", default="t2v",
                   help="comma list of t2v, i2v, ti2v, vace, v2v, animate")
    args = p.parse_args()
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    folder = args.folder
    if folder is None:
        from ditax.demo.folders import build_pipeline_folder

        folder = str(build_pipeline_folder(pathlib.Path(tempfile.mkdtemp()) / "pipe"))
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if "t2v" in cases:
        bench_phases(folder, args)
        bench_vae_memory(folder, args)
    if "i2v" in cases or "ti2v" in cases:
        bench_image_to_video(args, cases)
    if {"vace", "v2v", "animate"} & set(cases):
        from pipeline_control import bench_control

        bench_control(args, cases, emit, phase_timer)
    return 0


def bench_image_to_video(args, cases):
    """The tests' tiny random I2V / TI2V folders (tests/refs/i2v_reference.py), one image each."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from i2v_reference import image, make_tiny_i2v

    tmp = pathlib.Path(tempfile.mkdtemp())
    if "i2v" in cases:
        _, folder = make_tiny_i2v(tmp / "i2v", "i2v")
        bench_phases(str(folder), args, "i2v", "WanImageToVideoPipeline",
                     image(1, args.height, args.width))
    if "ti2v" in cases:
        import torch

        _, folder = make_tiny_i2v(tmp / "ti2v", "ti2v")
        first = image(2, args.height, args.width, kind="float")
        # same folder as an image-to-video pipeline for diffusers (TI2V ships as WanPipeline)
        bench_phases(str(folder), args, "ti2v", "WanImageToVideoPipeline", first,
                     torch.from_numpy(first.transpose(2, 0, 1).copy()))


if __name__ == "__main__":
    sys.exit(main())
