"""Resuming a run safely: the output folder, the run's saved config, the checkpoint's structure.

A rerun with the same ``output_dir`` resumes from the newest checkpoint. Before anything is
restored (or renamed, or written) :func:`check_resume` compares the run's saved
``config.yaml`` with the requested config through the trainer's :class:`ResumePolicy`:

- ``free`` keys may change without a word (how long to run, logging, checkpoint cadence, the
  mesh and attention backend: the same math on other devices / kernels);
- ``notice`` keys may change, and each change is printed (the optimiser's hyper-parameters,
  the objective's weighting: the run goes on, but no longer as a bit-exact continuation);
- every other key (model, LoRA, data, batch size, seed) is *refused*: one
  :class:`ResumeMismatch` naming each differing key ``old → new`` and the two fixes (the old
  values, or a new ``output_dir``), and nothing on disk touched.

:func:`check_structure` then compares the checkpoint's stored shapes and dtypes with the state
the config builds, so a mismatch the config does not show (no ``config.yaml``, a changed
default) is refused the same way instead of being taken for a damaged checkpoint.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from ditax.config.keys import value_text
from ditax.config.loader import flatten_keys
from ditax.errors import ConfigError
from ditax.io.files import path_arg
from ditax.io.outputs import atomic_file, check_writable_parent


class ResumeMismatch(ConfigError):
    """A rerun asks for a run other than the one its ``output_dir`` holds (exit 2)."""


@dataclass(frozen=True)
class ResumePolicy:
    """Which dotted config keys may change on resume. An entry ending in ``.`` is a whole
    section (``"checkpoint."``); anything matching neither tuple is refused, and so is a key
    in ``fixed`` inside a free or noticed section (``flow.target``: it decides what the state
    holds)."""

    free: tuple[str, ...]
    notice: tuple[str, ...]
    fixed: tuple[str, ...] = ()

    def kind(self, key: str) -> str:
        def hit(names):
            return any(key == n or (n.endswith(".") and key.startswith(n)) for n in names)

        if hit(self.fixed):
            return "refused"
        return "free" if hit(self.free) else "notice" if hit(self.notice) else "refused"


def check_output_dir(path, *, what: str = "output_dir", run_files=("config.yaml",
                                                                     "checkpoints"),
                     urls: bool = False) -> None:
    """:class:`ConfigError` unless ``path`` can hold a run: not a file, its parent creatable
    and writable, and, when it exists and is not empty, a folder holding a run (one of
    ``run_files``) rather than something else a run would write into. ``urls``: the caller
    runs remote URLs through :class:`~ditax.io.remote.runs.RunFolder` (``ditax train``);
    else a URL is refused. A remote URL is checked by listing it (its filesystem package
    installed, not a file, not a dataset or other files), a ``file://`` URL as its path."""
    from ditax.io.remote.urls import check_path_or_url, is_remote, is_url, local_file

    if is_url(path):
        if not urls:
            raise ConfigError(f"{what}={path}: this command writes a local folder only; give "
                              f"a local path")
        if is_remote(path):
            from ditax.io.remote.runs import check_run_url

            check_run_url(path.strip(), what, run_files=run_files)
            return
        path = local_file(path, what)
    check_path_or_url(path, what)
    p = path_arg(path, what, ConfigError, "a folder path for the run")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what}={path} is a file, not a folder; choose a folder path "
                          f"(it is created)")
    if p.is_dir():
        names = {c.name for c in p.iterdir()}
        if names and not names & set(run_files):
            shown = ", ".join(sorted(names)[:4]) + (", ..." if len(names) > 4 else "")
            raise ConfigError(f"{what}={path} is a non-empty folder that holds no run "
                              f"({shown}); choose a new or empty folder")
    # an existing run folder must take new files; a new one must be creatable
    check_writable_parent(p / "config.yaml" if p.is_dir() else p, what, sep="=",
                          error=ConfigError)


def open_run_folder(output_dir, say=print):
    """The :class:`~ditax.io.remote.runs.RunFolder` a run writes (``.local``): the folder
    itself for a local path, this host's staging folder, opened and pulled, for a URL. A
    URL run of several processes is refused (orbax needs one folder all of them write)."""
    import jax

    from ditax.io.remote.runs import RunFolder

    run = RunFolder(output_dir)
    if run.remote and jax.process_count() > 1:
        raise ConfigError(f"output_dir={output_dir}: a run of {jax.process_count()} processes "
                          f"cannot checkpoint to a URL (orbax merges every process's shards "
                          f"in one folder they all write, and a URL run writes a per-host "
                          f"staging folder); give a folder all hosts share, e.g. a gcsfuse "
                          f"mount /gcs/BUCKET/PATH")
    return run.open(say)


def read_saved_config(out) -> dict | None:
    """The run's saved ``config.yaml`` as a dict, or None when there is none."""
    from ditax.io.files import read_yaml

    f = pathlib.Path(out) / "config.yaml"
    if not f.is_file():
        return None
    fix = f"it records the run in {out}: restore it, or choose a new output_dir"
    saved = read_yaml(f, what="the run's saved config", fix=fix)
    if not isinstance(saved, dict):
        raise ConfigError(f"{f} does not hold a config mapping; {fix}")
    return saved


def check_resume(out, saved: dict | None, requested: dict, policy: ResumePolicy,
                 say=print) -> list[str]:
    """Compare the run's saved config with the requested one (both nested dicts); raise
    :class:`ResumeMismatch` for refused changes, print the ``notice`` ones. Keys present on
    one side only (another ditax version) are not compared. Returns the changed keys."""
    if saved is None:
        return []
    old, new = flatten_keys(saved), flatten_keys(requested)
    changed = [k for k in new if k in old and old[k] != new[k]]
    refused = [k for k in changed if policy.kind(k) == "refused"]
    if refused:
        diffs = ", ".join(f"{k}: {value_text(old[k])} → {value_text(new[k])}" for k in refused)
        keep = " ".join(f"{k}={value_text(old[k])}" for k in refused)
        raise ResumeMismatch(
            f"output_dir={out} holds a run with another setup ({diffs}); nothing was "
            f"changed there. To resume it, use the old values ({keep}); to start a new run, "
            f"choose a new output_dir")
    noticed = [k for k in changed if policy.kind(k) == "notice"]
    if noticed:
        say("resuming with changed "
            + ", ".join(f"{k} {value_text(old[k])} → {value_text(new[k])}" for k in noticed)
            + " (the run goes on with the new values; it is no longer a bit-exact continuation)")
    return changed


def _leaves(tree) -> dict[str, tuple]:
    import jax

    def key(path):
        return "/".join(str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p))))
                        for p in path)

    return {key(path): (tuple(leaf.shape), str(leaf.dtype))
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def structure_diff(stored, abstract) -> list[str]:
    """The leaves whose presence, shape or dtype differ between a checkpoint's stored
    metadata tree and the abstract state (``ShapeDtypeStruct`` tree), as short lines."""
    a, b = _leaves(stored), _leaves(abstract)
    out = [f"{k}: {a[k][0]} {a[k][1]} → {b[k][0]} {b[k][1]}"
           for k in a if k in b and a[k] != b[k]]
    out += [f"{k}: only in the checkpoint" for k in a if k not in b]
    out += [f"{k}: not in the checkpoint" for k in b if k not in a]
    return out


def check_structure(ckpt_dir, step: int, stored, abstract) -> None:
    """:class:`ResumeMismatch` when the checkpoint at ``step`` stores another state than the
    requested config builds (names the first differing leaves)."""
    diff = structure_diff(stored, abstract)
    if diff:
        more = f" (and {len(diff) - 3} more)" if len(diff) > 3 else ""
        raise ResumeMismatch(
            f"checkpoint step {step} in {ckpt_dir} stores another model state than this "
            f"config builds ({'; '.join(diff[:3])}{more}); nothing was changed there. Resume "
            f"with the config the run was trained with (its config.yaml), or choose a new "
            f"output_dir")


def write_config(out, cfg_dict: dict) -> pathlib.Path:
    """Write the run's ``config.yaml`` whole (:func:`~ditax.io.outputs.atomic_file`: a
    temporary sibling, flushed to the disk, renamed), so it is never half written; a failed
    write (the disk full) is :class:`~ditax.io.outputs.WriteFailed` naming it, and the
    ``config.yaml`` that was there stays as it was. Returns its path."""
    import yaml

    f = pathlib.Path(out) / "config.yaml"
    text = yaml.safe_dump(cfg_dict, sort_keys=False)
    with atomic_file(f) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return f


__all__ = ["ResumePolicy", "ResumeMismatch", "check_output_dir", "check_resume", "open_run_folder",
           "check_structure", "structure_diff", "read_saved_config", "write_config"]
