"""Writing a latent dataset to a URL (``ditax preprocess VIDEOS gs://bucket/latents``).

The dataset is written as for a local output, into a local staging folder
(``$DITAX_REMOTE_CACHE/preprocess/<url>-<hash>/``), then uploaded (:class:`DatasetUpload`):
every file first, the sizes listed back and compared, ``meta.json`` last. Without
``meta.json`` a folder is no dataset (the readers refuse it, :func:`~ditax.io.remote.datasets.
check_dataset` says the upload has not finished), so a reader never takes a half upload for a
dataset. The URL is checked before any work: its filesystem package installed, not a file,
nothing there (a dataset — ``meta.json`` — or other files are refused).

Several processes (``--num-processes N --process-id K``, :mod:`ditax.train.preprocess_parts`)
each stage their own folder. Before encoding, every part already complete at the URL has its
``part.json`` and empty-prompt embedding fetched (not its records), so the part logic sees
which parts are done (process K's own: nothing to encode) and that they ran with the same
settings. After encoding, process K uploads its part (``part.json`` last), fetches the other
parts' ``part.json`` again and, when all N are there, merges them into ``meta.json`` and
uploads it last. The process that uploads the last part sees all N, so one of them always
writes ``meta.json``; two that finish together write the same file. A URL that holds the
``meta.json`` of N processes is complete: every process then says so and exits 0.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil

from ditax.io.remote.datasets import META, _size
from ditax.io.remote.transfer import (download, join, listed, listing, local_listing,
                                      put_bytes, upload)
from ditax.io.remote.urls import RemoteError, cache_root, filesystem, resolve, slug

PART_JSON = "part.json"                   # ditax.train.preprocess_parts.PART_JSON
NULL_TEXT = "null_text.safetensors"       # ditax.train.data.NULL_TEXT
_PART = re.compile(r"part-\d{5}-of-(\d{5})")


class DatasetUpload:
    """A dataset (or process K of N's part of one) bound for ``url``: ``local`` is the
    staging folder to write it to, :meth:`finish` uploads it (module docstring). Checks the
    URL on construction (:class:`~ditax.io.remote.urls.RemoteError`, one line)."""

    def __init__(self, url: str, num_processes=None, process_id=None, *, merge=None,
                 what: str = "output", error=RemoteError):
        self.url = url.strip()
        self.n = num_processes if isinstance(num_processes, int) and num_processes > 1 else 1
        self.k = process_id if self.n > 1 and isinstance(process_id, int) else 0
        self.merge = merge              # merge_parts(folder, n, say): writes meta.json
        resolve(self.url, what, error=error)     # memory:// dies with the process: refused
        self.fs, self.root = filesystem(self.url, what, error)
        there, is_file = listed(self.fs, self.root, self.url, what, error)
        if is_file:
            raise error(f"{what} {self.url} is a file; give a new folder URL for the dataset")
        self.complete = False
        if META in there:
            made = self._remote_meta().get("num_processes") if self.n > 1 else None
            if made != self.n:
                raise error(f"{what} {self.url} already holds a dataset (meta.json); choose a "
                            f"new URL, or delete it first")
            self.complete = True
        other = [f for f in there if not (self.n > 1 and (
            f == NULL_TEXT or f == META or _PART.fullmatch(f.split("/")[0])))]
        if other:
            raise error(f"{what} {self.url} is not empty ({len(other)} files, e.g. "
                        f"{other[0]}); choose a new or empty URL")
        for f in there:
            m = _PART.fullmatch(f.split("/")[0])
            if m and int(m.group(1)) != self.n:
                raise error(f"{what} {self.url} holds {f.split('/')[0]}, a part of a "
                            f"{int(m.group(1))}-process run; this is --num-processes "
                            f"{self.n}: give --num-processes {int(m.group(1))}, or a new URL")
        base = cache_root() / "preprocess" / slug(self.url)
        self.local = base / (f"part-{self.k:05d}-of-{self.n:05d}" if self.n > 1 else "dataset")
        # an earlier, unfinished try (one process: a killed one's hidden folders beside it too)
        shutil.rmtree(self.local if self.n > 1 else base, ignore_errors=True)
        self.fetched: set[str] = set()
        if self.n > 1:
            self.local.mkdir(parents=True)
            self._fetch_parts(there)
            if self.complete:
                download(self.fs, self.root, [f for f in (META, NULL_TEXT) if f in there],
                         there, self.local, f"{what} {self.url}")
        else:
            self.local.parent.mkdir(parents=True, exist_ok=True)

    def _remote_meta(self) -> dict:
        try:
            meta = json.loads(self.fs.cat_file(join(self.root, META)))
        except Exception:  # noqa: BLE001 - unreadable: not this run's
            return {}
        return meta if isinstance(meta, dict) else {}

    def _fetch_parts(self, there: dict) -> None:
        """``part.json`` and the empty prompt's embedding of each part complete at the URL
        (and not here yet), into the staging folder; their records are not fetched."""
        done = sorted(f.split("/")[0] for f in there if f.count("/") == 1
                      and f.endswith("/" + PART_JSON) and _PART.fullmatch(f.split("/")[0]))
        new = [p for p in done if p not in self.fetched
               and not (self.local / p / PART_JSON).is_file()]
        names = [f"{p}/{f}" for p in new for f in (PART_JSON, NULL_TEXT) if f"{p}/{f}" in there]
        download(self.fs, self.root, names, there, self.local, f"output {self.url}")
        self.fetched |= set(new)

    def finish(self, say=print) -> str:
        """Upload what this process wrote (module docstring); returns the closing line's
        words (what was written, or which parts are still missing)."""
        done = f"wrote {self.url}; train with data.source={self.url}"
        try:
            if self.n == 1:
                self._upload_all(say)
                shutil.rmtree(self.local, ignore_errors=True)
                return done
            if self.complete:
                return f"{self.url} is complete (meta.json over {self.n} parts); " + done[
                    done.index("train"):]
            own = f"part-{self.k:05d}-of-{self.n:05d}"
            if own not in self.fetched and (self.local / own / PART_JSON).is_file():
                names = sorted(n for n in local_listing(self.local / own) if n != PART_JSON)
                say(f"uploading {own} to {self.url}, {PART_JSON} last")
                upload(self.fs, self.local / own, names, join(self.root, own))
                put_bytes(self.fs, join(self.root, f"{own}/{PART_JSON}"),
                          (self.local / own / PART_JSON).read_bytes())
            self._fetch_parts(listing(self.fs, self.root))
            parts = [p for p in self.local.iterdir() if (p / PART_JSON).is_file()]
            if len(parts) < self.n:
                return (f"wrote {self.url}/{own} ({len(parts)} of {self.n} parts there); the "
                        f"dataset is complete when every part is")
            if not (self.local / META).is_file():
                self.merge(self.local, self.n, say=say)
            if (self.local / NULL_TEXT).is_file():
                upload(self.fs, self.local, [NULL_TEXT], self.root)
            put_bytes(self.fs, join(self.root, META), (self.local / META).read_bytes())
            shutil.rmtree(self.local, ignore_errors=True)
            return done
        except RemoteError:
            raise
        except Exception as e:  # noqa: BLE001 - network, permissions: one line
            raise RemoteError(f"the dataset in {self.local} could not be uploaded to "
                              f"{self.url} ({type(e).__name__}: {str(e).strip()[:200]}); "
                              f"without meta.json there no reader takes it for a dataset. "
                              f"Fix that and run the same command again") from None

    def _upload_all(self, say) -> None:
        names = sorted(n for n in local_listing(self.local) if n != META)
        total = sum((self.local / n).stat().st_size for n in names)
        say(f"uploading {len(names) + 1} files ({_size(total)}) to {self.url}, meta.json last")
        upload(self.fs, self.local, names, self.root)
        put_bytes(self.fs, join(self.root, META), (self.local / META).read_bytes())


def upload_dataset(folder, url: str, say=None) -> None:
    """Upload a finished local dataset ``folder`` to ``url`` (nothing there yet), every file
    checked by size, ``meta.json`` last (tests, and datasets written before)."""
    up = DatasetUpload(url)
    up.local = pathlib.Path(folder)
    up._upload_all(say or (lambda _: None))


__all__ = ["DatasetUpload", "upload_dataset"]
