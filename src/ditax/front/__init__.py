"""The front door: the one place a sampling request is made, for the CLI, the server and the
library alike.

- :func:`resolve` ``(model, overrides, given, surface)``: a plain mapping (the CLI's flags by
  name, the server's JSON, a library call's keywords) → one frozen :class:`Request` =
  :class:`LoadRequest` (what to load: model, dtype, mesh, attention, quantize, offload,
  LoRAs …) + the checked pipeline call + :class:`Output`; defaults resolved and the request
  checked once, before any weights are read (:mod:`ditax.front.resolver`);
- :func:`open` ``(load)``: the folder's preflight, the run context and the loaded pipeline
  (:mod:`ditax.front.load`);
- what every sampling entry does first (:mod:`ditax.front.folder`: the folder, its family and
  its config) and the run context every command that runs a model enters
  (:mod:`ditax.front.run`, with the status line of :mod:`ditax.front.status`).

Nothing here imports argparse or :mod:`ditax.cli`; this module itself imports nothing heavy
(``ditax --help`` starts no JAX).

    import ditax.front as front

    req = front.resolve("demo", ["sample.cfg_mode=sequential"],
                        {"prompt": "a red ball rolls right", "num_inference_steps": 8})
    with front.open(req.load, req.call) as pipe:
        video = pipe(**req.kwargs())
"""

from __future__ import annotations

from ditax.front.request import LoadRequest, Output, Request

__all__ = ["LoadRequest", "Output", "Request", "open", "resolve"]


def resolve(model, overrides=(), given=None, surface: str = "python", **kwargs) -> Request:
    """:func:`ditax.front.resolver.resolve`."""
    from ditax.front.resolver import resolve as _resolve

    return _resolve(model, overrides, given, surface, **kwargs)


def open(load, call=None, **kwargs):  # noqa: A001 (the front door's verb)
    """:func:`ditax.front.load.open`."""
    from ditax.front.load import open as _open

    return _open(load, call, **kwargs)
