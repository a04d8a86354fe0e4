"""A training run whose ``output_dir`` is a URL: a local staging folder, synced.

Orbax writes checkpoints through tensorstore, which natively writes local paths and
``gs://`` only (``s3://`` arrays are refused as "not absolute"; epath has no ``memory://`` or
other fsspec protocols). So a run at a URL works on a local *staging* folder,
``$DITAX_REMOTE_CACHE/runs/<url>-<hash>/`` (default ``~/.cache/ditax/remote``): the loop,
orbax, the metrics writer and the LoRA export write there exactly as for a local run, and
:class:`RunFolder` / :class:`StepSync` keep the URL in step:

- **checkpoints** (:class:`StepSync`): once orbax has finished a step locally (its atomic
  rename), the step folder is uploaded in the background, every file listed back and compared
  by size, then the run's other files are pushed, then ``commit_success.txt`` (orbax's own
  commit file for ``gs://`` checkpoints, so orbax tools read the folder as finished) goes
  last. A step folder without it — an upload cut short by a kill or a lost connection — is
  never restored from: it is reported and replaced when that step is saved again. Keep-N
  pruning deletes the commit file first, so a half-deleted step is never taken either.
- **resume**: the URL is the truth. The staging folder keeps only the checkpoints that are
  committed there and whose files match by size; the newest committed step is downloaded
  when it is missing (an older one when the newest fails to read). ``config.yaml``,
  ``metrics.jsonl``, ``samples/``, LoRA files are pulled from the URL at the start.
- **the run's other files** (``config.yaml``, ``metrics.jsonl``, ``tb/``, ``samples/``,
  ``lora*.safetensors``, ``ditax_sample.json``): pushed (the changed ones) before each
  checkpoint's commit file and when the run ends.

Why stage even ``gs://``, which orbax could write directly: every URL then behaves (and is
tested) one way, a save returns at local-disk speed while the upload runs behind the training,
and the commit file is orbax's own. The cost: the staging folder holds ``checkpoint.keep``
checkpoints on the local disk (it stays after the run, so a rerun on this host downloads
nothing; delete it to reclaim the space), and a checkpoint reaches the URL one upload later.

One run per URL per host at a time (a lock file beside the staging folder). Runs of several
processes (``mesh.num_processes > 1``) need one checkpoint folder that all processes write
(orbax merges the processes' shards at the commit), so they are refused at a URL: give them a
shared folder, e.g. a gcsfuse mount (orbax treats ``/gcs/BUCKET/...`` as GCS).
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import threading

from ditax.io.remote.transfer import (download, join, listing, local_listing, put_bytes,
                                      remove, upload)
from ditax.io.remote.urls import RemoteError, cache_root, filesystem, resolve, slug, where

COMMIT = "commit_success.txt"       # orbax's atomicity_types.COMMIT_SUCCESS_FILE
CHECKPOINTS = "checkpoints"
NOT_PULLED = (CHECKPOINTS, "tb")    # checkpoints: per step; tb: rebuilt from metrics.jsonl
MIRRORED = ("tb",)                  # pushed with deletions (rewritten whole on resume)

_held: dict[str, object] = {}       # lock files this process holds (a staging folder each)
_held_lock = threading.Lock()


class StepSync:
    """The committed checkpoint steps at ``url`` (``fs``, ``root``) and the local folder
    ``local`` that orbax writes; see the module docstring for the protocol."""

    def __init__(self, fs, root: str, local: pathlib.Path, keep: int, before_commit=None,
                 url: str | None = None):
        self.fs, self.root, self.local = fs, root, pathlib.Path(local)
        self.url = url or where(fs, root)
        self.keep = keep
        self.before_commit = before_commit
        self.scan()

    def scan(self) -> None:
        """List the URL: each top-level folder's files and sizes."""
        self._remote: dict[str, dict[str, int]] = {}
        for rel, size in listing(self.fs, self.root).items():
            top, _, rest = rel.partition("/")
            self._remote.setdefault(top, {})[rest] = size

    def committed(self) -> list[int]:
        return sorted(int(n) for n, f in self._remote.items() if n.isdigit() and COMMIT in f)

    def partial(self) -> list[str]:
        """Step folders at the URL without their commit file (uploads never finished)."""
        return sorted(n for n, f in self._remote.items()
                      if COMMIT not in f and ".corrupt" not in n)

    def aside(self) -> list[str]:
        return sorted(n for n in self._remote if ".corrupt" in n)

    def _matches(self, step: int) -> bool:
        have = local_listing(self.local / str(step))
        return bool(have) and have == self._remote.get(str(step))

    def prepare(self, say=print) -> None:
        """Make the local folder hold only committed steps whose files match the URL's (what
        else is there — steps never committed there, moved-aside or half-written folders — is
        removed), then fetch the newest committed step if it is missing."""
        self.local.mkdir(parents=True, exist_ok=True)
        keep = set(self.committed())
        for p in self.local.iterdir():
            if not (p.name.isdigit() and int(p.name) in keep and self._matches(int(p.name))):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        if keep:
            self.fetch(max(keep), say)

    def fetch(self, step: int, say=print) -> None:
        """Download committed ``step`` into the local folder (a hidden folder renamed once
        every file arrived whole: :func:`~ditax.io.outputs.atomic_folder`; the local disk
        full is :class:`~ditax.io.outputs.WriteFailed` naming the step's folder), unless it
        is there already."""
        from ditax.io.outputs import atomic_folder

        if self._matches(step):
            return
        files = self._remote[str(step)]
        say(f"checkpoint: downloading step {step} from {self.url}")
        dst = self.local / str(step)
        with atomic_folder(dst) as tmp:
            download(self.fs, join(self.root, str(step)), sorted(files), files, tmp,
                     f"checkpoint step {step} of {self.url}")
            shutil.rmtree(dst, ignore_errors=True)      # another copy of it (not the URL's)

    def upload(self, step: int) -> None:
        """Upload the local finished ``step`` (commit file last), then prune past ``keep``."""
        folder = self.local / str(step)
        files = local_listing(folder)
        remote = join(self.root, str(step))
        if str(step) in self._remote:          # a stale or partial upload of this step
            remove(self.fs, join(remote, COMMIT))
            remove(self.fs, remote)
            del self._remote[str(step)]
        upload(self.fs, folder, sorted(n for n in files if n != COMMIT), remote)
        if self.before_commit is not None:
            self.before_commit()
        commit = folder / COMMIT
        mark = (commit.read_bytes() if commit.is_file()
                else f"Checkpoint commit was successful to {remote}".encode())
        put_bytes(self.fs, join(remote, COMMIT), mark)
        self._remote[str(step)] = {**files, COMMIT: len(mark)}
        for old in self.committed()[:-self.keep]:
            self.drop(old)

    def drop(self, step: int) -> None:
        """Delete committed ``step`` at the URL: its commit file first."""
        remote = join(self.root, str(step))
        remove(self.fs, join(remote, COMMIT))
        remove(self.fs, remote)
        self._remote.pop(str(step), None)

    def move_aside(self, step: int, name: str) -> None:
        """Rename ``step`` at the URL to ``name`` (``4.corrupt``), uncommitting it first."""
        remote = join(self.root, str(step))
        if str(step) not in self._remote:
            return
        remove(self.fs, join(remote, COMMIT))
        files = self._remote.pop(str(step))
        files.pop(COMMIT, None)
        if files:
            self.fs.mv(remote, join(self.root, name), recursive=True)
            self._remote[name] = files
        remove(self.fs, remote)


class RunFolder:
    """A run's ``output_dir``: ``local`` is where the run writes. For a local path (or a
    ``file://`` URL) that is the folder itself and nothing else happens; for a remote URL it
    is this host's staging folder, synced with the URL (module docstring)."""

    def __init__(self, output_dir: str, what: str = "output_dir", error=RemoteError):
        at = resolve(output_dir, what, error=error, expected="a folder for the run")
        self.url = at if isinstance(at, str) else None
        self.fs = self.root = None
        self._pushed: dict[str, tuple] = {}
        self._lock = threading.Lock()
        if self.url is None:
            self.local = at
            return
        self.fs, self.root = filesystem(self.url, what, error)
        self.local = cache_root() / "runs" / slug(self.url)

    @property
    def remote(self) -> bool:
        return self.url is not None

    def open(self, say=print) -> "RunFolder":
        """Take the run's host lock, empty the staging folder but for its checkpoints (kept
        where they match the URL's, see :meth:`StepSync.prepare`) and pull the run's other
        files from the URL."""
        if not self.remote:
            return self
        self._hold()
        self.local.mkdir(parents=True, exist_ok=True)
        for p in self.local.iterdir():
            if p.name != CHECKPOINTS:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        there = listing(self.fs, self.root)
        pull = sorted(n for n in there if n.split("/")[0] not in NOT_PULLED)
        download(self.fs, self.root, pull, there, self.local, f"output_dir={self.url}")
        self._pushed = {n: self._stamp(n) for n in pull}
        return self

    def _hold(self) -> None:
        import fcntl

        key = str(self.local)
        with _held_lock:
            if key in _held:        # an earlier run of this process (ended or failed)
                return
            from ditax.io.remote.transfer import open_lock

            f = open_lock(pathlib.Path(f"{self.local}.lock"))
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise RemoteError(f"output_dir={self.url} is in use by another run on this "
                                  f"host (its staging folder {self.local} is locked); wait "
                                  f"for it or choose another output_dir") from None
            _held[key] = f

    def release(self) -> None:
        """Let another run of this host use the URL (the lock taken by :meth:`open`)."""
        with _held_lock:
            f = _held.pop(str(self.local), None)
        if f is not None:
            f.close()

    def shown(self, path) -> str:
        """How to name a file the run wrote, for messages: its place at the URL (it is
        uploaded when the run ends), or the path itself for a local run."""
        path = pathlib.Path(path)
        if not self.remote or not path.is_relative_to(self.local):
            return str(path)
        return f"{self.url.rstrip('/')}/{path.relative_to(self.local).as_posix()}"

    def _stamp(self, name: str):
        st = (self.local / name).stat()
        return st.st_size, st.st_mtime_ns

    def push(self) -> None:
        """Upload the run's files other than checkpoints that changed since they were last
        pushed or pulled; under ``tb/`` the URL is made to match the staging folder."""
        if not self.remote:
            return
        with self._lock:
            now = {}
            for n in local_listing(self.local, skip=(CHECKPOINTS,)):
                with contextlib.suppress(FileNotFoundError):    # removed since listed
                    now[n] = self._stamp(n)
            todo = sorted(n for n, s in now.items() if self._pushed.get(n) != s)
            upload(self.fs, self.local, todo, self.root)
            gone = [n for n in self._pushed if n not in now and n.split("/")[0] in MIRRORED]
            for top in MIRRORED:
                with contextlib.suppress(FileNotFoundError):
                    gone += [f"{top}/{n}" for n in listing(self.fs, join(self.root, top))
                             if f"{top}/{n}" not in now]
            for n in sorted(set(gone)):
                remove(self.fs, join(self.root, n))
            self._pushed = now

    def close(self) -> None:
        """The run ended: push its last files, release the host lock."""
        if self.remote:
            self.push()
            self.release()

    def steps(self, keep: int) -> StepSync | None:
        """The checkpoint sync of a remote run (None for a local one)."""
        if not self.remote:
            return None
        return StepSync(self.fs, join(self.root, CHECKPOINTS), self.local / CHECKPOINTS, keep,
                        before_commit=self.push, url=f"{self.url.rstrip('/')}/{CHECKPOINTS}")


def check_run_url(url: str, what: str = "output_dir", error=RemoteError,
                  run_files=("config.yaml", CHECKPOINTS)) -> None:
    """A remote ``output_dir`` can hold a run: its filesystem installed, not a file, and when
    something is there, a run (``run_files``) — a dataset (``meta.json``) or other files are
    refused."""
    resolve(url, what, error=error)         # memory:// dies with the process: refused
    fs, root = filesystem(url, what, error)
    try:
        there = listing(fs, root)
        is_file = not there and fs.isfile(root)
    except Exception as e:  # noqa: BLE001
        raise error(f"{what}={url} cannot be listed ({type(e).__name__}: "
                    f"{str(e).strip()[:200]})") from None
    if is_file:
        raise error(f"{what}={url} is a file, not a folder; choose a folder URL (it is "
                    f"created)")
    tops = {n.split("/")[0] for n in there}
    if "meta.json" in tops and not tops & set(run_files):
        raise error(f"{what}={url} holds a dataset (meta.json), not a run; choose a new URL "
                    f"for the run (a dataset is read with data.source={url})")
    if tops and not tops & set(run_files):
        shown = ", ".join(sorted(tops)[:4]) + (", ..." if len(tops) > 4 else "")
        raise error(f"{what}={url} is a non-empty folder that holds no run ({shown}); choose "
                    f"a new or empty folder")


__all__ = ["COMMIT", "StepSync", "RunFolder", "check_run_url"]
