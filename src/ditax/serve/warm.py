"""``ditax serve --warm SPECS``: compile the programs of the request sizes a server expects
before its first job, so that nothing compiles on the request path.

A spec is ``WIDTHxHEIGHTxFRAMES`` (a video model; ``WIDTHxHEIGHT`` takes the folder's frames)
or ``WIDTHxHEIGHT`` (an image model), with an optional ``:STEPS`` (else the folder's default
steps); several are separated by commas: ``--warm 832x480x81,480x832x81:30``. Each becomes a
request body (prompt ``"warm-up"``) checked as a ``POST /v1/videos`` of it would be
(:func:`~ditax.serve.requests.check_body`, the server's limits included) before the model
loads; a bad one is one line and exit 2. Once the model is loaded, :func:`start` runs
:meth:`~ditax.serve.worker.Worker.warm` on the stored requests in a thread of its own — every
batch size the worker may run, reading the persistent compile cache where it holds the
programs — while uvicorn already answers: ``/health`` is ``"warming"`` (503) and the worker
claims nothing (submitted jobs queue) until the warm-up has ended; then the worker starts and
``/health`` is ``"ok"`` (200) with ``"ready": true``.
"""

from __future__ import annotations

import re
import threading
import time

from ditax.errors import ConfigError

SPEC = re.compile(r"(\d{1,6})[xX](\d{1,6})(?:[xX](\d{1,5}))?(?::(\d{1,5}))?")
EXAMPLE = "e.g. --warm 832x480x81 or --warm 832x480x81:30,480x832x81 (an image model: 1024x1024)"


def parse_specs(text: str) -> list[str]:
    """``--warm``'s comma-separated specs (repeats dropped), each ``WxHxF[:STEPS]`` or
    ``WxH[:STEPS]``; a :class:`ValueError` naming a bad one."""
    specs = [s.strip() for s in str(text).split(",")]
    for s in specs:
        if not SPEC.fullmatch(s):
            raise ValueError(
                f"{s!r} is not WIDTHxHEIGHTxFRAMES[:STEPS] (an image model: "
                f"WIDTHxHEIGHT[:STEPS]); {EXAMPLE}")
    return list(dict.fromkeys(specs))


def body_of(spec: str, makes: str) -> dict:
    """The request body of one spec for a model that makes ``makes`` ("video" or "image")."""
    width, height, frames, steps = SPEC.fullmatch(spec).groups()
    if frames is not None and makes == "image":
        raise ConfigError(f"--warm {spec}: this model makes images, which have no frames; give "
                          f"WIDTHxHEIGHT[:STEPS], e.g. --warm {width}x{height}")
    body = {"prompt": "warm-up", "size": f"{width}x{height}"}
    if frames is not None:
        body["num_frames"] = int(frames)
    if steps is not None:
        body["num_inference_steps"] = int(steps)
    return body


def warm_requests(specs: list[str], makes: str, check) -> list[tuple[str, dict]]:
    """``[(spec, stored request)]``: each spec's body through ``check`` (body → the
    :class:`~ditax.serve.requests.Checked` of a POST, raising
    :class:`~ditax.serve.requests.BadRequest`); a refused one is a :class:`ConfigError` line
    naming the spec and the request's words."""
    from ditax.serve.requests import BadRequest

    out = []
    for spec in specs:
        body = body_of(spec, makes)
        try:
            try:
                checked = check(body)
            except BadRequest as e:       # an image-to-video model: its requests bring one
                if e.param != "image":
                    raise
                checked = check({**body, "image": gray_png(body["size"])})
        except BadRequest as e:
            raise ConfigError(f"--warm {spec}: {e}") from None
        out.append((spec, checked.stored))
    return out


def gray_png(size: str) -> str:
    """A mid-gray PNG of ``size`` ("WxH"), base64: the first frame of an image-to-video
    model's warm-up request (the programs depend on its size, not its pixels)."""
    import base64
    import io

    import PIL.Image

    width, height = (int(v) for v in size.lower().split("x"))
    buf = io.BytesIO()
    PIL.Image.new("RGB", (width, height), (128, 128, 128)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def start(state) -> None:
    """Start ``state``'s worker (a :class:`~ditax.serve.app.ServeState`): at once without
    ``state.warm``, else from a thread that first compiles the warm requests (``state.ready``
    stays False until then; ``state.warming`` is the thread)."""
    if not state.warm:
        state.ready = True
        state.worker.start()
        return
    state.ready = False
    state.warming = threading.Thread(target=warm_then_start, args=(state,), daemon=True,
                                     name="ditax-serve-warm")
    state.warming.start()


def warm_then_start(state) -> None:
    """Compile the warm requests (one line says how many programs, how long, how many read
    from the compile cache), then start the worker unless the server is stopping. A warm-up
    that fails says why in one line (``/health``'s ``warm_error``) and the server serves all
    the same: a request of that size would fail with the same reason."""
    worker, m = state.worker, state.metrics
    compiles, hits = m.compiles, m.cache_hits
    specs = ", ".join(spec for spec, _ in state.warm)
    try:
        state.warm_seconds = round(worker.warm([stored for _, stored in state.warm]), 3)
        state.warm_programs, state.warm_cache_hits = m.compiles - compiles, m.cache_hits - hits
        state.say(f"warm: compiled {state.warm_programs} programs for {specs} in "
                  f"{state.warm_seconds:.1f} s (compile cache hits {state.warm_cache_hits})")
    except Exception as e:  # noqa: BLE001 — said, and the server goes on without it
        state.warm_error = f"{type(e).__name__}: {e}"
        state.say(f"warm: compiling {specs} failed ({state.warm_error}); serving without it")
    finally:
        if not worker.stopping:
            worker.start()
        state.ready = True


def finish(state, drain: float, forced, store) -> None:
    """At the server's stop: wait for a warm-up still compiling, at most ``drain`` seconds
    (less once ``forced`` is set); past them the process exits at once (``os._exit(0)``, the
    store closed): no job runs during a warm-up, and a thread torn down inside XLA at the
    interpreter's end would abort it."""
    import os
    import sys

    thread = state.warming
    end = time.monotonic() + drain
    while thread is not None and thread.is_alive() and not forced.is_set() \
            and time.monotonic() < end:
        thread.join(0.1)
    if thread is None or not thread.is_alive():
        return
    store.close()
    print("stopping: the warm-up was still compiling; the process exits without it (no job "
          "had started)", flush=True)
    sys.stderr.flush()
    os._exit(0)


__all__ = ["body_of", "finish", "parse_specs", "start", "warm_requests"]
