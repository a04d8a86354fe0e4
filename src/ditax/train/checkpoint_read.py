"""A run's checkpoint folder read without a checkpoint manager: its finished steps
(:func:`finished_steps`) and, at one step, the model's parameters alone as host arrays
(:func:`read_params`: no optimiser state, no device placement, whatever mesh wrote it) —
what ``ditax export`` and a checkpoint's listing need.
"""

from __future__ import annotations

import pathlib

import orbax.checkpoint as ocp


def finished_steps(directory) -> list[int]:
    """The steps of the finished checkpoints in ``directory`` (``{step}/`` folders; a save in
    progress or interrupted is a ``*.orbax-checkpoint-tmp*`` folder, a moved-aside one
    ``{step}.corrupt``); read from the folder alone, no checkpoint manager made. A URL's are
    its committed steps (``{step}/commit_success.txt``, :mod:`ditax.io.remote.runs`)."""
    from ditax.io.remote.urls import is_remote

    if is_remote(str(directory)):
        from ditax.io.remote.runs import StepSync
        from ditax.io.remote.urls import filesystem

        fs, root = filesystem(str(directory), "checkpoints")
        return StepSync(fs, root, pathlib.Path("."), keep=1).committed()
    d = pathlib.Path(directory)
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and p.is_dir())


# the parts of a train state that hold model parameters: what trains, and a partly frozen run's
# frozen rest when its checkpoints hold it
PARAM_PARTS = ("params", "frozen")


def read_params(directory, step: int, abstract: dict) -> tuple[dict, list[str]]:
    """The model's parameters at checkpoint ``step`` of ``directory``, as numpy arrays on the
    host: the entries of ``abstract`` (the model's parameter tree, a pure dict of
    ``ShapeDtypeStruct`` or arrays) that the train state's ``params`` or ``frozen`` hold;
    nothing else is read (no optimiser state) and no device placement is asked, so any
    checkpoint reads on one process whatever mesh wrote it. Returns ``(tree, missing)``:
    ``missing`` the dotted paths of ``abstract`` it does not hold (a partly frozen run's base,
    which its checkpoints leave out). Stored shapes and dtypes are compared first
    (:class:`~ditax.train.resume.ResumeMismatch` naming the first that differ)."""
    import jax
    import numpy as np

    from ditax.train.resume import check_structure

    folder = pathlib.Path(directory).absolute() / str(step) / "state"   # orbax: absolute
    handler = ocp.PyTreeCheckpointHandler()     # the item's own reader: no step metadata asked
    stored = handler.metadata(folder)
    stored = getattr(stored, "tree", stored)
    item, missing = {}, []

    def pick(like, have):       # the entries of ``like`` at the paths ``have`` holds
        out = {}
        for k, v in like.items():
            got = have.get(k, have.get(str(k))) if isinstance(have, dict) else None
            if got is not None:
                out[k] = pick(v, got) if isinstance(v, dict) else v
        return out

    for part in PARAM_PARTS:
        if isinstance(stored.get(part), dict):
            item[part] = pick(abstract, stored[part])
            check_structure(directory, step, stored[part], item[part])
    held = set()
    for part in item.values():
        held |= {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(part)[0]}
    for k, _ in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        if jax.tree_util.keystr(k) not in held:
            missing.append(".".join(str(getattr(e, "key", e)) for e in k))
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    try:
        got = handler.restore(folder, args=ocp.args.PyTreeRestore(
            item=item, restore_args=args, partial_restore=True))
    finally:
        handler.close()
    tree: dict = {}
    for part in PARAM_PARTS:
        tree = _merge(tree, got.get(part, {}))
    return tree, missing


def _merge(a: dict, b: dict) -> dict:
    """``a`` with ``b``'s entries put in (nested dicts merged)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


__all__ = ["PARAM_PARTS", "finished_steps", "read_params"]
