"""The demo's causal student (issue 59) against its teacher: videos at 1x and ``long`` x the
teacher's frames, scored by the demo world's scorer (:func:`ditax.synthetic.score.score`) per
window of the teacher's length, with the time to the first frame and the frames per second of
each (what ``make demo`` prints and :mod:`ditax.recipes.demo_causal` ships as
``score.json``).

A window is ``window`` consecutive frames (the teacher's 17): the video cut into windows one
after the other, the last one ending at the video's last frame (so a 77-frame video has 5
windows, the last overlapping the fourth). A window is right on an attribute when the scorer
tells the prompt's colour / direction in it; a video's share is over its windows.
"""

from __future__ import annotations

import time

ATTRIBUTES = ("colour", "shape", "direction")


def windows(frames: int, window: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of the windows of a ``frames``-frame video (module docstring)."""
    if frames <= window:
        return [(0, frames)]
    out = [(a, a + window) for a in range(0, frames - window + 1, window)]
    if out[-1][1] < frames:
        out.append((frames - window, frames))
    return out


def window_scores(video, prompt: str, window: int) -> list[dict]:
    """The scorer's verdict (``{attribute}_correct`` and what it saw) on each window of
    ``video [F, H, W, 3]``."""
    from ditax.synthetic.score import score

    rows = []
    for a, b in windows(len(video), window):
        s = score(video[a:b], prompt)
        rows.append({"start": a, "stop": b, **{k: s[k] for k in ATTRIBUTES},
                     **{f"{k}_correct": bool(s[f"{k}_correct"]) for k in ATTRIBUTES}})
    return rows


def share(rows: list[dict]) -> dict:
    """Per attribute, the share of ``rows`` (windows) that are right, in percent."""
    return {k: round(100.0 * sum(r[f"{k}_correct"] for r in rows) / max(len(rows), 1), 1)
            for k in ATTRIBUTES}


def timed_call(pipe, prompt: str, **call):
    """``(video, seconds to the first frame, seconds in all)`` of one pipeline call; a causal
    student's first frame is its first chunk's (``on_chunk``), a bidirectional model's is
    the whole video's."""
    t0 = time.perf_counter()
    first = []
    if getattr(pipe, "streams_chunks", False):
        call = {**call, "on_chunk": lambda i, made, frames: first or first.append(
            time.perf_counter() - t0)}
    video = pipe(prompt, progress=False, **call)
    total = time.perf_counter() - t0
    return video, (first[0] if first else total), total


def run_model(pipe, prompts, seeds, call: dict, window: int, tag: str, write=None,
              say=print) -> dict:
    """Each prompt x seed through ``pipe`` (one warm-up call first: compiling is not timed),
    scored per window; ``write(prompt, video)`` for the first seed's videos (mp4s).
    ``{"rows", "score" (percent), "first_frame_s", "fps", "frames"}``: the medians."""
    import statistics

    pipe(prompts[0], seed=seeds[0], progress=False, **call)     # compile
    rows, firsts, fps = [], [], []
    frames = 0
    for prompt in prompts:
        for seed in seeds:
            video, first, total = timed_call(pipe, prompt, seed=seed, **call)
            frames = len(video)
            firsts.append(first)
            fps.append(frames / total)
            for w in window_scores(video, prompt, window):
                rows.append({"prompt": prompt, "seed": seed, **w})
            if write is not None and seed == seeds[0]:
                write(prompt, video)
    res = {"frames": frames, "score": share(rows),
           "first_frame_s": round(statistics.median(firsts), 3),
           "fps": round(statistics.median(fps), 1), "windows": len(rows), "rows": rows}
    sc = res["score"]
    say(f"  {tag}: {frames} frames, per window of {window}: colour {sc['colour']:.1f}%, "
        f"direction {sc['direction']:.1f}% ({len(rows)} windows); first frame "
        f"{res['first_frame_s']:.3f} s, {res['fps']:.1f} frames/s")
    return res


def long_frames(frames: int, temporal: int, long: int) -> int:
    """Video frames of ``long`` x the latent frames of a ``frames``-frame video."""
    return temporal * ((frames - 1) // temporal + 1) * long - temporal + 1


def score_causal(student, teacher, prompts, seeds, *, long: int = 4, teacher_steps=None,
                 write=None, say=print) -> dict:
    """The teacher (folder ``teacher``, its ``ditax_sample.json``; ``teacher_steps``: fewer
    steps) at 1x vs the causal ``student`` folder at 1x and ``long`` x the teacher's frames,
    over ``prompts`` x ``seeds``, per window of the teacher's frames (:func:`run_model`);
    ``write(kind, prompt, video)``: kind ``teacher`` / ``causal`` / ``causal_long``."""
    from ditax.pipelines.sample_defaults import CALL_KEYS, read_sample_defaults
    from ditax.pipelines.wan.loading import load_pipeline

    t_call = {k: v for k, v in read_sample_defaults(teacher).items() if k in CALL_KEYS}
    if teacher_steps:
        t_call["num_inference_steps"] = teacher_steps
    frames = t_call["num_frames"]
    size = {k: t_call[k] for k in ("height", "width")}
    res = {"prompts": list(prompts), "seeds": list(seeds), "window": frames}
    spipe = load_pipeline(student)
    temporal = spipe.vae.scale_factor_temporal
    n_long = long_frames(frames, temporal, long)
    runs = (("teacher", load_pipeline(teacher), t_call),
            ("causal", spipe, {**size, "num_frames": frames}),
            ("causal_long", spipe, {**size, "num_frames": n_long}))
    for kind, pipe, call in runs:
        w = None if write is None else (lambda p, v, kind=kind: write(kind, p, v))
        res[kind] = run_model(pipe, list(prompts), list(seeds), call, frames, kind, write=w,
                              say=say)
    res["gap_points"] = {k: round(res["teacher"]["score"][k] - res["causal_long"]["score"][k],
                                  1) for k in ("colour", "direction")}
    return res




def run_causal_demo(teacher_rec: dict, out, prompts, seed: int = 0, path=None, say=print,
                    long: int = 4) -> dict:
    """``make demo``'s causal part: ``prompts`` through the shipped causal student
    (:func:`ditax.demo.causal_model_path`, or ``path``) at 1x and ``long`` x the teacher's
    frames (``out/causal_*.mp4``, ``out/causal_long_*.mp4``), scored per window; beside the
    teacher's record ``teacher_rec`` (:func:`ditax.demo.run.run_demo`'s: its scores, one
    window a video, and its seconds per video, which are its time to the first frame)."""
    import pathlib

    from ditax import demo
    from ditax.compile_cache import compile_cache
    from ditax.io.video import write_mp4
    from ditax.pipelines.sample_defaults import CALL_KEYS, read_sample_defaults
    from ditax.pipelines.wan.loading import load_pipeline

    t0 = time.perf_counter()
    out = pathlib.Path(out)
    t_call = {k: v for k, v in read_sample_defaults(demo.model_path()).items()
              if k in CALL_KEYS}
    frames, size = t_call["num_frames"], {k: t_call[k] for k in ("height", "width")}
    files = []

    def writer(prefix):
        def write(prompt, video):
            files.append(str(write_mp4(out / f"{prefix}{'_'.join(prompt.split()[1:])}.mp4",
                                       video)))
        return write

    rec = {}
    with compile_cache("auto"):
        pipe = load_pipeline(path or demo.causal_model_path())
        n_long = long_frames(frames, pipe.vae.scale_factor_temporal, long)
        for kind, n in (("causal", frames), ("causal_long", n_long)):
            rec[kind] = run_model(pipe, list(prompts), [seed], {**size, "num_frames": n},
                                  frames, kind, write=writer(f"{kind}_"), say=say)
            rec[kind].pop("rows")
    ph, n = teacher_rec["phases"], len(teacher_rec["videos"])
    per_video = sum(ph[k] for k in ("text", "denoise", "decode")) / n
    rec["teacher"] = {"frames": frames, "first_frame_s": round(per_video, 3),
                      "fps": round(frames / per_video, 1),
                      "score": {k: round(100.0 * v, 1) for k, v in
                                teacher_rec["score"].items()}}
    rec["files"], rec["seconds"] = files, time.perf_counter() - t0
    return rec


def summary_lines(rec: dict) -> list[str]:
    """What ``make demo`` prints of :func:`run_causal_demo`'s record."""
    lines = []
    for kind, what in (("teacher", "teacher (bidirectional, 25 steps x CFG)"),
                       ("causal", "causal student (4 steps a chunk), 1x"),
                       ("causal_long", "causal student, 4x")):
        r = rec[kind]
        sc = r["score"]
        lines.append(f"{what}: {r['frames']} frames; colour {sc['colour']:.0f}%, direction "
                     f"{sc['direction']:.0f}% per window; first frame after "
                     f"{r['first_frame_s']:.3f} s, {r['fps']:.1f} frames/s")
    return lines


__all__ = ["long_frames", "run_causal_demo", "run_model", "score_causal", "share",
           "summary_lines", "timed_call", "window_scores", "windows"]
