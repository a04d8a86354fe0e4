"""Room for checkpoints: which write failures mean "no room" (a full disk, a used-up quota, a
file past ``ulimit -f``), how big a checkpoint is, and the one line a failed save says
(:func:`save_failure`: what happened, the space a checkpoint needs and what is free, the fix,
and the checkpoint the same command resumes from) — :class:`~ditax.train.checkpoint.Checkpointer`
raises it as :class:`~ditax.train.checkpoint.CheckpointSaveError`.
"""

from __future__ import annotations

import contextlib
import errno
import pathlib
import re
import shutil

# the os errors that mean "no room to write", and what each says (tensorstore reports them
# in a ValueError's text: ``RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='28']``)
NO_ROOM = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
           errno.EFBIG: "a file outgrew this process's file-size limit (ulimit -f{limit})"}


def no_room(e: BaseException) -> int | None:
    """The errno of ``e`` (or of an exception it was raised from) when it is one of
    :data:`NO_ROOM`; None for any other failure."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            return e.errno
        code = re.search(r"os_error_code='?(\d+)", str(e))
        if code and int(code.group(1)) in NO_ROOM:
            return int(code.group(1))
        for code, words in ((errno.ENOSPC, "No space left on device"),
                            (errno.EDQUOT, "Disk quota exceeded"), (errno.EFBIG, "File too large")):
            if words in str(e):
                return code
        e = e.__cause__ or e.__context__
    return None


def folder_bytes(folder: pathlib.Path) -> int:
    """Bytes of the files under ``folder`` (0 when it is gone)."""
    total = 0
    for f in pathlib.Path(folder).rglob("*"):
        with contextlib.suppress(OSError):
            if f.is_file():
                total += f.stat().st_size
    return total


def size_text(n: float) -> str:
    """``n`` bytes as ``df -h`` would say it (``6.3 MiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def save_failure(directory: pathlib.Path, step: int, e: BaseException, done: list[int],
                 state_bytes: int, committed_at=None) -> str:
    """The one line of a failed save of ``step`` into ``directory`` (``done``: the finished
    steps there; ``state_bytes``: the train state's size, the first save's need;
    ``committed_at``: a URL run's URL, where the finished steps are committed). The save's
    partial folder is named, not removed: writes of the failed save still in flight would
    create it again (a rerun's save of that step replaces it)."""
    partial = sorted(directory.glob(f"{step}.orbax-checkpoint-tmp*"))
    drop = (f"delete its partial folder {', '.join(p.name for p in partial)}, "
            if partial else "")
    resume = (f"it resumes from checkpoint step {done[-1]}, which is intact" if done else
              "no checkpoint was finished yet, so it starts from step 0")
    if committed_at is not None:       # the local disk filled up, not the URL
        resume = resume.replace("which is intact", f"committed at {committed_at}")
    code = no_room(e)
    if code is None:
        first = str(e).splitlines()[0][:300] if str(e) else ""
        return (f"checkpoint step {step} could not be written to {directory} "
                f"({type(e).__name__}: {first}); {drop}fix that and rerun the same "
                f"command: {resume}")
    free = shutil.disk_usage(directory if directory.exists() else directory.parent).free
    freed = free + sum(folder_bytes(p) for p in partial)    # once the partial one is gone
    need, basis = state_bytes, "the train state's size"
    if done:    # the last one's size on disk is the closer estimate, unless it would fit
        last = folder_bytes(directory / str(done[-1]))
        if last > freed or last >= need:
            need, basis = last, f"step {done[-1]}'s size"
    have = f"{size_text(free)} is free there" + (
        f", {size_text(freed)} once the partial folder is deleted" if partial else "")
    limit = ""
    if code == errno.EFBIG:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        limit = "" if soft == resource.RLIM_INFINITY else f" = {size_text(soft)}"
        fix = "raise the limit (ulimit -f unlimited)"
    elif code == errno.EDQUOT:
        fix = "raise the quota or free space under it"
    else:
        more = size_text(need - freed) if need > freed else size_text(need)
        fix = (f"free at least {more} more there or set output_dir to a disk with room "
               f"(checkpoint.keep=N keeps fewer)")
    return (f"checkpoint step {step} could not be written to {directory}: "
            f"{NO_ROOM[code].format(limit=limit)}; a checkpoint needs about "
            f"{size_text(need)} ({basis}) and {have}. To go on, {drop}{fix}, and rerun "
            f"the same command: {resume}")


__all__ = ["NO_ROOM", "folder_bytes", "no_room", "save_failure", "size_text"]
