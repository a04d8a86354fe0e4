"""Whole folders to and from URLs: a new folder written to a URL (``ditax export --out
gs://...``), a run read from one (``ditax export gs://.../run``).

:func:`upload_folder` puts every file, lists them back to compare sizes, and writes the folder's
*entry* file last (a pipeline folder's ``model_index.json``, which loaders open first): until it
is there, the URL holds no folder a loader takes. :func:`check_new_url` refuses, before any
work, a URL that already holds files. :func:`run_copy` makes the local copy of a run at a URL
that ``ditax export`` reads: its ``config.yaml``, and its checkpoint steps as a
:class:`~ditax.io.remote.runs.StepSync` (one step is downloaded, the one exported).
"""

from __future__ import annotations

import pathlib

from ditax.io.remote.runs import CHECKPOINTS, StepSync
from ditax.io.remote.transfer import (download, join, listed, local_listing, put_bytes,
                                      upload)
from ditax.io.remote.urls import RemoteError, cache_root, filesystem, resolve, slug


def check_new_url(url: str, what: str = "--out", error=RemoteError):
    """``url`` can take a new folder: its filesystem installed, nothing there. Returns
    ``(fs, root)``; a URL whose storage dies with this process (``memory://``) is refused."""
    resolve(url, what, error=error)
    fs, root = filesystem(url, what, error)
    there, is_file = listed(fs, root, url, what, error)
    if is_file or there:
        raise error(f"{what} {url} exists and is not an empty folder; pass a new folder "
                    f"(nothing is overwritten)")
    return fs, root


def staging(url: str, kind: str) -> pathlib.Path:
    """This host's local folder for ``url`` (``kind``: ``exports``, ``export-out`` ...)."""
    return cache_root() / kind / slug(url)


def upload_folder(folder, url: str, last: str, error=RemoteError) -> None:
    """Upload local ``folder`` to ``url``: every file (sizes checked), ``last`` at the end."""
    fs, root = filesystem(url, "--out", error)
    folder = pathlib.Path(folder)
    names = sorted(n for n in local_listing(folder) if n != last)
    try:
        upload(fs, folder, names, root)
        if (folder / last).is_file():
            put_bytes(fs, join(root, last), (folder / last).read_bytes())
    except Exception as e:  # noqa: BLE001 - network, permissions: one line
        raise error(f"{folder} could not be uploaded to {url} ({type(e).__name__}: "
                    f"{str(e).strip()[:200]}); without its {last} there no loader takes it "
                    f"for a folder. Fix that and run again") from None


def run_copy(url: str, what: str = "RUN_DIR", error=RemoteError):
    """``(folder, steps, names)`` of the run at ``url``: a local folder holding its
    ``config.yaml`` (when it has one), the :class:`StepSync` of its checkpoints (committed
    steps; ``steps.fetch(step)`` downloads one into ``folder/checkpoints``), and the names at
    the top of the URL (its other files are not fetched)."""
    fs, root = filesystem(url, what, error)
    there, is_file = listed(fs, root, url, what, error)
    if is_file or not there:
        raise error(f"{what} {url} {'is a file' if is_file else 'does not exist'}; pass the "
                    f"output_dir of a ditax train run (the folder holding config.yaml and "
                    f"checkpoints/)")
    folder = staging(url, "exports")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").unlink(missing_ok=True)
    if "config.yaml" in there:
        download(fs, root, ["config.yaml"], there, folder, f"{what} {url}")
    steps = StepSync(fs, join(root, CHECKPOINTS), folder / CHECKPOINTS, keep=1 << 30,
                     url=f"{url.rstrip('/')}/{CHECKPOINTS}")
    return folder, steps, {n.split("/")[0] for n in there}


__all__ = ["check_new_url", "staging", "upload_folder", "run_copy"]
