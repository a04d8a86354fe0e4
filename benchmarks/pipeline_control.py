"""``benchmarks/pipeline.py --cases vace,v2v,animate``: per-phase seconds of ditax's VACE,
video-to-video and Animate calls (first call: with XLA compilation; second: warm) against
diffusers' WanVACEPipeline / WanVideoToVideoPipeline / WanAnimatePipeline on the same tiny
random folders the tests use (``tests/refs``), from the same initial noise, with the videos'
max abs difference (see pipeline.py's docstring for the phases)."""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import time

import numpy as np

PROMPT = dict(prompt="a cat walks on the grass in the sun", negative_prompt="blurry")


def _ref_phases(ref, timed) -> None:
    """diffusers' phases: text, the condition's encodes ("image"), decode (the rest: denoise)."""
    ref.encode_prompt = timed(ref.encode_prompt, "text")
    if getattr(ref, "image_encoder", None) is not None:
        ref.encode_image = timed(ref.encode_image, "image")
    ref.vae.encode = timed(ref.vae.encode, "image")
    ref.vae.decode = timed(ref.vae.decode, "decode")


def _case(name, ours, reference, ref, emit, phase_timer, load_s, ref_load_s):
    """Run ``ours()`` twice (cold, warm) and ``reference()`` once (phases timed), emit rows."""
    import torch

    video = ours()
    cold = ours.pipe.timings
    video = ours()
    warm = ours.pipe.timings
    spent = {"text": 0.0, "image": 0.0, "decode": 0.0}
    _ref_phases(ref, phase_timer(spent))
    with torch.no_grad():
        s = time.perf_counter()
        want = reference()
        total = time.perf_counter() - s
    d = {"load": ref_load_s, **spent, "denoise": total - sum(spent.values())}
    for phase in ("load", "text", "image", "denoise", "decode"):
        ours_warm = load_s if phase == "load" else getattr(warm, phase)
        ours_cold = load_s if phase == "load" else getattr(cold, phase)
        emit(bench="pipeline", case=name, metric=f"{phase}_s", value=round(ours_warm, 4),
             cold=round(ours_cold, 4), unit="s", baseline=round(d[phase], 4),
             ratio=round(d[phase] / max(ours_warm, 1e-9), 3),
             baseline_name="diffusers (torch CPU)")
    emit(bench="pipeline", case=name, metric="compile_s", value=round(cold.compile, 4),
         unit="s", note="first call's ahead-of-time compile (step + decode); 0 when warm")
    emit(bench="pipeline", case=name, metric="max_abs_diff_vs_diffusers",
         value=float(np.abs(video - want).max()), unit="")


def _ours(pipe, **kw):
    call = lambda: pipe(progress=False, **kw)  # noqa: E731
    call.pipe = pipe
    return call


def bench_control(args, cases, emit, phase_timer) -> None:
    import PIL.Image
    import torch

    import ditax

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "refs"))
    from i2v_reference import image

    torch.set_num_threads(os.cpu_count() or 1)
    tmp = pathlib.Path(tempfile.mkdtemp())
    h, w, f, steps = args.height, args.width, args.frames, args.steps
    frames = [image(10 + i, h, w) for i in range(f)]
    if "vace" in cases:
        import diffusers
        from vace_reference import make_tiny_vace

        _, folder = make_tiny_vace(tmp / "vace")
        t0 = time.perf_counter()
        pipe = ditax.load_pipeline(folder)
        load_s = time.perf_counter() - t0
        masks = []
        for i in range(f):
            m = np.zeros((h, w, 3), np.uint8)
            m[h // 4:3 * h // 4, w // 4:3 * w // 4] = 255 if 0 < i < f - 1 else 0
            masks.append(PIL.Image.fromarray(m))
        kw = dict(PROMPT, height=h, width=w, num_frames=f, num_inference_steps=steps,
                  guidance_scale=5.0, guidance_scale_2=3.0, video=frames, mask=masks,
                  reference_images=[image(9, h, w)], conditioning_scale=0.5)
        lat = np.random.default_rng(1).standard_normal(
            pipe.latent_shape(h, w, f + 4)).astype(np.float32)
        t0 = time.perf_counter()
        ref = diffusers.WanVACEPipeline.from_pretrained(folder)
        ref.set_progress_bar_config(disable=True)
        ref_load = time.perf_counter() - t0
        _case(f"vace {f}x{h}x{w}, {steps} steps, CFG, 2 experts, mask + reference",
              _ours(pipe, latents=lat, **kw),
              lambda: np.asarray(ref(latents=torch.from_numpy(lat), output_type="np",
                                     **kw).frames[0], np.float32),
              ref, emit, phase_timer, load_s, ref_load)
    if "v2v" in cases:
        _bench_v2v(tmp, args, frames, emit, phase_timer)
    if "animate" in cases:
        _bench_animate(tmp, args, emit, phase_timer)


def _bench_v2v(tmp, args, frames, emit, phase_timer):
    import diffusers
    import torch

    import ditax
    from ditax.pipelines.sampling import initial_noise
    from pipeline_reference import make_tiny_pipeline

    h, w, f, steps = args.height, args.width, args.frames, args.steps
    _, folder = make_tiny_pipeline(tmp / "v2v", layers=1)
    t0 = time.perf_counter()
    pipe = ditax.load_pipeline(folder, video_to_video=True)
    load_s = time.perf_counter() - t0
    kw = dict(PROMPT, num_inference_steps=steps, guidance_scale=5.0)
    video = np.stack([np.asarray(fr, np.float32) / 255.0 for fr in frames])
    t0 = time.perf_counter()
    ref = diffusers.WanVideoToVideoPipeline.from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    ref_load = time.perf_counter() - t0
    mod = diffusers.pipelines.wan.pipeline_wan_video2video
    noise = torch.from_numpy(np.array(initial_noise(3, pipe.latent_shape(h, w, f))))

    def reference():
        orig, mod.randn_tensor = mod.randn_tensor, lambda s, **_: noise.reshape(s)
        try:
            return np.asarray(ref(video=list(frames), strength=0.6, height=h, width=w,
                                  output_type="np", **kw).frames[0], np.float32)
        finally:
            mod.randn_tensor = orig

    _case(f"v2v {f}x{h}x{w}, {steps} steps at strength 0.6, CFG",
          _ours(pipe, video=video, strength=0.6, seed=3, **kw), reference, ref, emit,
          phase_timer, load_s, ref_load)


def _bench_animate(tmp, args, emit, phase_timer):
    import ditax
    from animate_reference import diffusers_animate, make_tiny_animate
    from i2v_reference import Z, image

    h, w, steps = args.height, args.width, args.steps
    seg = 9                                     # two segments of 9 frames over 17 pose frames
    import diffusers

    _, folder = make_tiny_animate(tmp / "animate")
    t0 = time.perf_counter()
    pipe = ditax.load_pipeline(folder)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = diffusers.WanAnimatePipeline.from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    ref_load = time.perf_counter() - t0
    p = pipe.transformer.config.motion_encoder_size
    n = 2 * seg - 1
    kw = dict(PROMPT, image=image(7, h, w), pose_video=[image(20 + i, h, w) for i in range(n)],
              face_video=[image(60 + i, p, p) for i in range(n)], height=h, width=w,
              segment_frame_length=seg, num_inference_steps=steps, guidance_scale=1.0)
    shape = (1, Z, 1 + (seg - 1) // 4 + 1, h // 8, w // 8)
    _case(f"animate {n}x{h}x{w}, 2 segments of {seg}, {steps} steps",
          _ours(pipe, seed=2, **kw), lambda: diffusers_animate(ref, shape, 2, [0, 1], **kw),
          ref, emit, phase_timer, load_s, ref_load)
