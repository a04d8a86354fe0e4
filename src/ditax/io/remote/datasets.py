"""Latent datasets at URLs: read through a per-host local mirror, written by upload.

**Reading** (``data.source=gs://bucket/latents``). The ArrayRecord reader that grain uses is
C++ that opens local files, so a remote dataset is not streamed: each host keeps a *mirror*,
``$DITAX_REMOTE_CACHE/datasets/<url>-<hash>/`` (default ``~/.cache/ditax/remote``), and
training reads the mirror at local-disk speed. :func:`mirror_dataset` reads the remote
``meta.json`` first, lists the remote folder once, and downloads only the files ``meta.json``
names (``files``, which a version-2 bucketed dataset lists across its bucket and part
folders, and ``null_text``) that the mirror lacks or holds with another size; ``meta.json``
goes into the mirror last. A ``meta.json`` that differs from the mirror's (another dataset
written at the same URL) empties the mirror first. The host needs the dataset's size free on
that disk (checked before any download); processes of one host share one mirror under a lock
file, so the first downloads and the others wait and then verify. A demanding user with a
dataset larger than a host's disk needs a streaming source, which ditax does not have yet.

Writing a dataset to a URL (``ditax preprocess``): :mod:`ditax.io.remote.dataset_output`.
"""

from __future__ import annotations

import pathlib
import posixpath
import shutil

from ditax.io.remote.transfer import download, host_lock, join, listing, local_listing
from ditax.io.remote.urls import (RemoteError, cache_root, check_path_or_url, filesystem,
                                  is_url, resolve, slug)

META = "meta.json"
FORMAT = "ditax-latents"        # ditax.train.data.FORMAT (io does not import train)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def dataset_files(meta: dict) -> list[str] | None:
    """The files a dataset's ``meta.json`` names, relative to its folder (``files`` —
    version 1's, or version 2's list of every bucket's — each bucket's ``files``, and
    ``null_text``); None when they are not a list of safe relative paths."""
    names = []
    for b in meta.get("buckets") or ():
        names += b.get("files", []) if isinstance(b, dict) else [None]
    names += meta.get("files") if isinstance(meta.get("files"), list) else [None]
    if meta.get("null_text") is not None:
        names.append(meta.get("null_text"))
    out = []
    for n in names:
        if (not isinstance(n, str) or not n or n.startswith("/")
                or ".." in posixpath.normpath(n).split("/")):
            return None
        if n not in out:
            out.append(n)
    return out


def check_dataset(url: str, what: str = "data.source", error=RemoteError):
    """Check a remote dataset without downloading it: the URL, its filesystem, its
    ``meta.json`` (read first) and every file it names present. Returns
    ``(fs, root, meta_bytes, files, sizes)``; each problem is ``error`` in one line."""
    from ditax.io.files import parse_json

    fs, root = filesystem(url, what, error)
    try:
        sizes = listing(fs, root)
        is_file = not sizes and fs.isfile(root)
    except Exception as e:  # noqa: BLE001 - credentials, network: one line
        raise error(f"{what}={url} cannot be listed ({type(e).__name__}: "
                    f"{str(e).strip()[:200]})") from None
    if is_file:
        raise error(f"{what}={url} is a file, not a dataset folder; give the folder `ditax "
                    f"preprocess` wrote (the one holding meta.json)")
    if not sizes:
        raise error(f"{what}={url} does not exist (nothing is stored there); give a dataset "
                    f"folder written by `ditax preprocess`, or data.source=synthetic")
    if META not in sizes:
        raise error(f"{what}={url} has no meta.json, so it is no ditax latent dataset (or its "
                    f"upload has not finished: meta.json is written last); create one with "
                    f"`ditax preprocess VIDEOS_DIR {url}`")
    try:
        data = fs.cat_file(join(root, META))
        text = data.decode("utf-8-sig")
    except Exception as e:  # noqa: BLE001
        raise error(f"{url}/{META} cannot be read ({type(e).__name__}: "
                    f"{str(e).strip()[:200]})") from None
    meta = parse_json(text, f"{url.rstrip('/')}/{META}", what="dataset meta.json",
                      fix="re-run `ditax preprocess`", error=error)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise error(f"{url.rstrip('/')}/{META}: format {got!r} is not {FORMAT!r}; re-run "
                    f"`ditax preprocess`")
    files = dataset_files(meta)
    if files is None:
        raise error(f"{url.rstrip('/')}/{META} lacks a valid files list (damaged or "
                    f"hand-edited); re-run `ditax preprocess`")
    missing = [f for f in files if f not in sizes]
    if missing:
        raise error(f"dataset {url}: files listed in meta.json are missing there: "
                    f"{missing[:3]}{' ...' if len(missing) > 3 else ''}; re-run `ditax "
                    f"preprocess`")
    return fs, root, data, files, sizes


def mirror_dataset(url: str, say=None, what: str = "data.source",
                   error=RemoteError) -> pathlib.Path:
    """This host's local copy of the remote dataset ``url`` (see the module docstring),
    brought up to date and verified by size; returns its folder."""
    fs, root, meta_bytes, files, sizes = check_dataset(url, what, error)
    folder = cache_root() / "datasets" / slug(url)
    with host_lock(folder):
        folder.mkdir(parents=True, exist_ok=True)
        meta = folder / META
        if meta.is_file() and meta.read_bytes() != meta_bytes:
            shutil.rmtree(folder)           # another dataset at this URL: start over
            folder.mkdir()
        have = local_listing(folder)
        todo = [f for f in files if have.get(f) != sizes[f]]
        if todo or not meta.is_file():
            meta.unlink(missing_ok=True)    # a mirror is complete only with its meta.json
            need = sum(sizes[f] for f in todo)
            free = shutil.disk_usage(folder).free
            if need > free:
                raise error(f"{what}={url}: this host's mirror {folder} needs "
                            f"{_size(need)} more and {_size(free)} is free there; free "
                            f"space or set DITAX_REMOTE_CACHE to a disk with room")
            if say is not None and todo:
                say(f"{what}={url}: downloading {len(todo)} files ({_size(need)}) to this "
                    f"host's mirror {folder}")
            download(fs, root, todo, sizes, folder, f"{what}={url}")
            from ditax.io.outputs import atomic_file

            with atomic_file(meta) as tmp:
                tmp.write_bytes(meta_bytes)
    return folder


def local_dataset(source, say=None, what: str = "data.source", error=RemoteError) -> str:
    """The local folder to read the dataset ``source`` from: a local path as given, a
    ``file://`` URL's path, a remote URL's mirror (:func:`mirror_dataset`)."""
    if not is_url(source):
        return source
    where = resolve(source, what, error=error, output=False)
    if not isinstance(where, str):      # file://: the local path
        return str(where)
    return str(mirror_dataset(where, say=say, what=what, error=error))


def checked_source(source, what: str = "data.source"):
    """The CLI's early check of a dataset path: a remote URL is checked there
    (:func:`check_dataset`, nothing downloaded) and None returned; otherwise the local path
    to check with ``read_meta`` (a ``file://`` URL's path, a path as given)."""
    if not is_url(source):
        check_path_or_url(source, what)     # a URL typed with one slash: refused
        return source
    where = resolve(source, what, output=False)
    if isinstance(where, str):
        check_dataset(where, what)
        return None
    return str(where)


def local_source(cfg, say=None):
    """``cfg`` with ``data.source`` the local folder to read (:func:`local_dataset`): the
    same object when the source is no URL. Only the readers get it; the run's config and
    checkpoints keep the URL."""
    import dataclasses

    if not is_url(cfg.data.source):
        return cfg
    local = local_dataset(cfg.data.source, say=say)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=local))


__all__ = ["META", "dataset_files", "check_dataset", "mirror_dataset", "local_dataset",
           "local_source", "checked_source"]
