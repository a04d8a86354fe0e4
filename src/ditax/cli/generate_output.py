"""``ditax generate``'s result written where the request's :class:`~ditax.front.Output` says
(renamed whole, :func:`ditax.io.results.write_result`), with its timing and wrote lines."""

from __future__ import annotations

import time


def _timing(pipe) -> str:
    """The pipeline's timing line of its last call and a separator (empty: it keeps none)."""
    timings = getattr(pipe, "timings", None)
    return f"{timings.line()} | " if timings is not None else ""


def write_output(output, out, pipe, makes: str) -> None:
    """Write one result, renamed whole (:func:`ditax.io.results.write_result`; a failed write
    is one line naming the file and the cause, exit 1) where ``output`` (a
    :class:`~ditax.front.Output`) says; print the timing and wrote lines."""
    from ditax.cli import CommandFailed
    from ditax.io.audio import AudioTrack
    from ditax.io.outputs import WriteFailed
    from ditax.io.results import write_result

    t0 = time.perf_counter()
    audio, extras = None, {}
    if isinstance(out, dict):          # a family with further outputs (PipelineFamily.outputs)
        extras = {k: v for k, v in out.items() if k != makes}
        audio = extras.pop("audio", None)     # a sound track goes into the mp4
        if audio is not None and not isinstance(audio, AudioTrack):
            extras["audio"] = audio
            audio = None
        out = out[makes]
    try:
        for path in write_result(output.path, out, fps=output.fps or 16, audio=audio,
                                 extras=extras, frames_dir=output.frames_dir):
            print(f"wrote {path}")
    except WriteFailed as e:
        raise CommandFailed(str(e)) from e
    path = output.path      # as it was checked (a file:// URL: its local path)
    if makes == "image":
        print(f"{_timing(pipe)}write {time.perf_counter() - t0:.2f}s")
        print(f"wrote {path} ({out.shape[1]}x{out.shape[0]} image)")
        return
    print(f"{_timing(pipe)}write {time.perf_counter() - t0:.2f}s")
    st = getattr(pipe, "last_stats", {})
    if st.get("cache") or st.get("cfg_cache"):
        skipped = sum(len(v) for v in st["skipped_steps"].values())
        reused = len(st.get("cfg_reused_steps", []))
        print(f"step cache {st['cache'] or 'off'} (threshold {st['cache_threshold']}), cfg_cache "
              f"{'on' if st['cfg_cache'] else 'off'}: {st['transformer_calls']} transformer calls "
              f"for {st['steps']} steps ({skipped} skipped, {reused} unconditional reused)")
    f, h, w, _ = out.shape
    sound = (f", {audio.channels}-channel {audio.sample_rate} Hz AAC sound track"
             if audio is not None else "")
    print(f"wrote {path} ({f} frames, {w}x{h}, {output.fps} fps{sound})"
          + (f" and {f} PNG frames in {output.frames_dir}" if output.frames_dir else ""))
