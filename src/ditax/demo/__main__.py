"""``python -m ditax.demo`` (``make demo``): the shipped demo model and its 4-step student on
three prompts (one held out), then the small Flux and its student; prints what each is
sampled with, per-phase timings and prompt-following scores, and the files written
(:mod:`ditax.demo.run`); the model's causal student at 1x and 4x the teacher's frames
(:mod:`ditax.demo.causal`).
"""

from __future__ import annotations

import os

from ditax import demo
from ditax.demo.causal import run_causal_demo, summary_lines
from ditax.demo.run import OUT, run_demo, run_flux_demo


def main(argv=None) -> int:
    import time

    t0 = time.perf_counter()
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    print(f"ditax demo: the demo model trained by `make demo-model` ({demo.model_path()})")
    print(f"sampling with {demo.SAMPLE}")
    print(f"its 4-step student ({demo.student_lora_path()}) with {demo.STUDENT_SAMPLE}, "
          f"loaded with {demo.STUDENT_LOAD}")
    rec = run_demo()
    rows = [("teacher", rec)] + ([("student", rec["student"])] if "student" in rec else [])
    for who, r in rows:
        ph = r["phases"]
        sampling = sum(ph[k] for k in ("text", "compile", "denoise", "decode"))
        print(f"timing ({who}): " + " | ".join(f"{k} {v:.2f}s" for k, v in ph.items())
              + f" | sampling {sampling:.2f}s ({ph['denoise']:.2f}s denoising)")
    for who, r in rows:
        sc = r["score"]
        print(f"prompt following (ditax.synthetic.score), {who}, over {len(r['videos'])} "
              f"videos: colour {sc['colour']:.0%}, shape {sc['shape']:.0%}, direction "
              f"{sc['direction']:.0%}")
    print(f"wrote {', '.join(v['file'] for _, r in rows for v in r['videos'])} and "
          f"{rec['sheet']} ({time.perf_counter() - t0:.1f}s)")
    print(f"its causal student ({demo.causal_model_path()}): chunk by chunk, at 1x and 4x "
          f"the teacher's frames, scored per window of the teacher's length")
    causal = run_causal_demo(rec, OUT, demo.DEMO_PROMPTS)
    for line in summary_lines(causal):
        print(line)
    print(f"wrote {', '.join(causal['files'])} ({causal['seconds']:.1f}s)")
    print(f"ditax demo: the small Flux trained by `make flux-demo-model` "
          f"({demo.flux_model_path()})")
    print(f"sampling with {demo.FLUX_SAMPLE}")
    print(f"its 4-step student ({demo.flux_student_lora_path()}) with "
          f"{demo.FLUX_STUDENT_SAMPLE}")
    rec = run_flux_demo()
    for who, r in [("teacher", rec)] + ([("student", rec["student"])] if "student" in rec
                                        else []):
        sc = r["score"]
        print(f"prompt following (ditax.synthetic.images.score_image), {who}, over "
              f"{len(r['images'])} images: colour {sc['colour']:.0%}, shape {sc['shape']:.0%}, "
              f"position {sc['position']:.0%}; {r['seconds_per_image']:.3f} s an image")
    files = [i["file"] for i in rec["images"] + rec.get("student", {}).get("images", [])]
    print(f"wrote {', '.join(files)} and {rec['sheet']} ({rec['total']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
