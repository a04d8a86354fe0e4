"""``open(load)``: the pipeline a :class:`~ditax.front.request.LoadRequest` names, loaded inside
the run context (attention entry contexts, the compile cache, the status line), after the
folder's family checked it against the request (its preflight: no weights read)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def open(load, call=None, *, progress: bool = True, say=print):  # noqa: A001 (front.open)
    """Inside: the loaded pipeline of ``load`` (a :class:`~ditax.front.request.LoadRequest`),
    checked first against ``call`` (the request's pipeline call; None: the folder and the
    attention backend only) by the folder's family; ``progress``: the status line while
    loading and compiling; ``say``: where the mesh and compile-cache lines go."""
    import ditax
    from ditax.front.run import run_context
    from ditax.pipelines.family import preflight

    mesh = load.make_mesh()
    kwargs = load.kwargs()
    preflight(load.path, kwargs, None if call is None else dict(call), mesh)
    if mesh is not None:
        say(f"mesh: {dict(mesh.shape)}")
    with run_context(load.attention, mesh, compile_cache=load.compile_cache,
                     status=progress, precision=load.precision) as folder:
        say(f"compile cache: {folder or 'off'}")
        yield ditax.load_pipeline(load.path, mesh=mesh, **kwargs)


__all__ = ["open"]
