"""``python -m ditax.demo``'s runs: prompts through the shipped demo model and its 4-step
student (:func:`run_demo`: mp4s, a contact sheet, per-phase timings, prompt-following scores)
and through the small Flux and its student (:func:`run_flux_demo`: PNGs, a sheet, scores).
"""

from __future__ import annotations

import pathlib

from ditax import demo

OUT = pathlib.Path("demo_out")


def _slug(prompt: str) -> str:
    return "_".join(prompt.split()[1:])


def _sample_prompts(pipe, prompts, seed, sample, out, prefix, say, tag=""):
    """``prompts`` through ``pipe(prompt, seed=seed + i, **sample)``: each written as
    ``out/{prefix}{slug}.mp4`` and scored; ``(rows, videos, phases)``."""
    import time

    from ditax.io.video import write_mp4
    from ditax.synthetic.score import score
    from ditax.synthetic.vocab import is_held_out, parse_prompt

    phases = {"load": pipe.load_time, "text": 0.0, "compile": 0.0, "denoise": 0.0,
              "decode": 0.0, "write": 0.0}
    videos, rows = [], []
    for i, prompt in enumerate(prompts):
        video = pipe(prompt, seed=seed + i, progress=False, **sample)
        for k in ("text", "compile", "denoise", "decode"):
            phases[k] += getattr(pipe.timings, k)
        t1 = time.perf_counter()
        mp4 = write_mp4(out / f"{prefix}{_slug(prompt)}.mp4", video)
        phases["write"] += time.perf_counter() - t1
        sc = score(video, prompt)
        held = is_held_out(parse_prompt(prompt))
        rows.append({"prompt": prompt, "held_out": held, "file": str(mp4),
                     "transformer_calls": pipe.last_stats.get("transformer_calls"), **{
                         k: sc[k] for k in ("colour_correct", "shape_correct",
                                            "direction_correct", "colour", "shape",
                                            "direction")}})
        videos.append(video)
        mark = lambda ok: "ok" if ok else "MISS"   # noqa: E731
        say(f"  {tag}{prompt!r}{' (held out of training)' if held else ''}: colour "
            f"{sc['colour'] or '-'} {mark(sc['colour_correct'])}, shape "
            f"{sc['shape'] or '-'} {mark(sc['shape_correct'])}, direction "
            f"{sc['direction'] or '-'} {mark(sc['direction_correct'])} -> {mp4}")
    return rows, videos, phases


def _summary(rows) -> dict:
    return {k: sum(r[f"{k}_correct"] for r in rows) / len(rows)
            for k in ("colour", "shape", "direction")}


def run_demo(out=OUT, prompts=demo.DEMO_PROMPTS, seed: int = 0, path=None, say=print,
             student: bool = True) -> dict:
    """Generate ``prompts`` with the demo model (as :data:`SAMPLE` says) and, with
    ``student``, with its 4-step student (:func:`load_student`, :data:`STUDENT_SAMPLE`; the
    same seeds); write mp4s (the student's ``student_*.mp4``) + one contact sheet (each
    teacher row above its student row); return the record (per-phase seconds, scores; the
    student's under ``"student"``)."""
    import time

    t0 = time.perf_counter()
    from ditax.compile_cache import compile_cache
    from ditax.pipelines.wan.loading import load_pipeline
    from ditax.synthetic.sheet import contact_sheet

    t_import = time.perf_counter() - t0
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sample = demo.SAMPLE
    with compile_cache("auto") as cache_dir:
        pipe = load_pipeline(path or demo.model_path())
        rows, videos, phases = _sample_prompts(pipe, prompts, seed, sample, out, "", say,
                                               "teacher " if student else "")
        phases = {"import": t_import, **phases}
        if student:
            spipe = demo.load_student(path)
            s_sample = demo.STUDENT_SAMPLE
            s_rows, s_videos, s_phases = _sample_prompts(spipe, prompts, seed, s_sample, out,
                                                         "student_", say, "student ")
    t1 = time.perf_counter()
    sheet_videos, labels = [], []
    for i, (p, r) in enumerate(zip(prompts, rows)):
        held = "  [held out]" if r["held_out"] else ""
        sheet_videos.append(videos[i])
        if not student:
            labels.append(p + held)
            continue
        labels.append(f"teacher, {sample.get('num_inference_steps')} steps x CFG: {p}{held}")
        sheet_videos.append(s_videos[i])
        labels.append(f"student, {s_sample.get('num_inference_steps')} steps: {p}{held}")
    sheet = contact_sheet(sheet_videos, labels, out / "contact_sheet.png", frames=9, scale=2)
    phases["write"] += time.perf_counter() - t1
    rec = {"phases": phases, "videos": rows, "score": _summary(rows), "sheet": str(sheet),
           "compile_cache": str(cache_dir) if cache_dir else None,
           "total": time.perf_counter() - t0}
    if student:
        rec["student"] = {"phases": s_phases, "videos": s_rows, "score": _summary(s_rows),
                          "sample": s_sample, "lora": str(demo.student_lora_path())}
    return rec


def run_flux_demo(out=OUT, prompts=demo.FLUX_PROMPTS, seed: int = 0, path=None, say=print,
                  student: bool = True) -> dict:
    """Generate ``prompts`` with the small Flux (and, with ``student``, its 4-step student, the
    shipped LoRA); write ``flux_*.png`` (``flux_student_*.png``) and ``flux_contact_sheet.png``
    (the student's rows after the teacher's) into ``out``; return the record (seconds per
    image, scores; the student's under ``"student"``)."""
    import time

    import numpy as np
    import PIL.Image

    from ditax.compile_cache import compile_cache
    from ditax.pipelines.flux.loading import load_pipeline
    from ditax.synthetic.images import HELD_OUT, parse_image_prompt, score_image
    from ditax.synthetic.sheet import contact_sheet

    t0 = time.perf_counter()
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [("", demo.FLUX_SAMPLE, [])]
    if student:
        runs.append(("student_", demo.FLUX_STUDENT_SAMPLE,
                     [(str(demo.flux_student_lora_path()), 1.0)]))
    recs = []
    with compile_cache("auto"):
        for tag, sample, loras in runs:
            pipe = load_pipeline(path or demo.flux_model_path(), loras=loras)
            images, rows, seconds = [], [], []
            for i, prompt in enumerate(prompts):
                t = time.perf_counter()
                image = pipe(prompt, seed=seed + i, progress=False, **sample)
                seconds.append(time.perf_counter() - t)
                png = out / f"flux_{tag}{_slug(prompt)}.png"
                PIL.Image.fromarray(np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)
                                    ).save(png)
                sc = score_image(image, prompt)
                held = parse_image_prompt(prompt) in HELD_OUT
                rows.append({"prompt": prompt, "held_out": held, "file": str(png),
                             **{k: sc[k] for k in ("colour_correct", "shape_correct",
                                                   "position_correct", "colour", "shape",
                                                   "position")}})
                images.append(image)
                mark = lambda ok: "ok" if ok else "MISS"   # noqa: E731
                say(f"  {tag or 'teacher_'}{prompt!r}{' (held out of training)' if held else ''}"
                    f": colour {sc['colour'] or '-'} {mark(sc['colour_correct'])}, shape "
                    f"{sc['shape'] or '-'} {mark(sc['shape_correct'])}, position "
                    f"{sc['position'] or '-'} {mark(sc['position_correct'])} -> {png}")
            score = {k: sum(r[f"{k}_correct"] for r in rows) / len(rows)
                     for k in ("colour", "shape", "position")}
            # the first call compiles: the median of the others (or the one) per image
            timed = seconds[1:] or seconds
            recs.append({"images": rows, "score": score, "pixels": images,
                         "seconds_per_image": float(np.median(timed))})
    labels = [p + ("  [held out]" if r["held_out"] else "")
              for p, r in zip(prompts, recs[0]["images"])]
    if student:
        labels += [f"{p}  [4-step student]" for p in prompts]
    sheet = contact_sheet([im[None] for r in recs for im in r.pop("pixels")], labels,
                          out / "flux_contact_sheet.png", frames=1, scale=4)
    rec = {**recs[0], "sheet": str(sheet), "total": time.perf_counter() - t0}
    if student:
        rec["student"] = recs[1]
    return rec


__all__ = ["OUT", "run_demo", "run_flux_demo"]
