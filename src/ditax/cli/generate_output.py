"""``ditax generate``'s result written where the request's :class:`~ditax.front.Output` says
(renamed whole, :func:`ditax.io.results.write_result`), with its timing and wrote lines.

The timing line's ``write`` is the seconds from the pipeline's return (the decode's end) to the
outputs written whole. A video whose decode handed its frames over as they were decoded
(:class:`~ditax.io.video_stream.Mp4Stream`, :meth:`~ditax.pipelines.base.Pipeline.hand_frames`)
was mostly encoded by then: ``write`` is what was left (the last chunk's frames, the mp4's
end, PNG frames, the renames) and ``(overlapped S s)`` the seconds ffmpeg ran beside the
decode; otherwise the whole encode came after the decode, and ``(not overlapped: WHY)`` says
why (a tiled or row-split decode, a pipeline that decodes whole, ``--prompts``)."""

from __future__ import annotations

import time


def _timing(pipe) -> str:
    """The pipeline's timing line of its last call and a separator (empty: it keeps none)."""
    timings = getattr(pipe, "timings", None)
    return f"{timings.line()} | " if timings is not None else ""


def overlap_note(stream, whole: str | None, decoded: float) -> str:
    """The timing line's words after a video's ``write`` (module docstring): ``stream`` (the
    :class:`~ditax.io.video_stream.Mp4Stream` the decode was offered; None: none), ``whole``
    (why none was offered), ``decoded`` (``perf_counter()`` at the decode's end)."""
    if stream is not None and stream.used:
        return f" (overlapped {stream.overlapped(decoded):.2f}s)"
    why = stream.reason if stream is not None else whole
    return f" (not overlapped: {why or 'the pipeline handed over no frames'})"


def write_output(output, out, pipe, makes: str, stream=None, whole: str | None = None) -> None:
    """Write one result, renamed whole (:func:`ditax.io.results.write_result`; a failed write
    is one line naming the file and the cause, exit 1) where ``output`` (a
    :class:`~ditax.front.Output`) says; print the timing and wrote lines. ``stream``: the
    :class:`~ditax.io.video_stream.Mp4Stream` the pipeline call was given (its mp4 is taken
    where frames were put), ``whole``: why there was none (module docstring)."""
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
        encoded = stream if stream is not None and stream.used else None
        for path in write_result(output.path, out, fps=output.fps or 16, audio=audio,
                                 extras=extras, frames_dir=output.frames_dir,
                                 encoded=encoded):
            print(f"wrote {path}")
    except WriteFailed as e:
        raise CommandFailed(str(e)) from e
    path = output.path      # as it was checked (a file:// URL: its local path)
    if makes == "image":
        print(f"{_timing(pipe)}write {time.perf_counter() - t0:.2f}s")
        print(f"wrote {path} ({out.shape[1]}x{out.shape[0]} image)")
        return
    note = overlap_note(stream, whole, t0)
    print(f"{_timing(pipe)}write {time.perf_counter() - t0:.2f}s{note}")
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
