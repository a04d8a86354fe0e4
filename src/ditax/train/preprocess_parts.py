"""``ditax preprocess ... --num-processes N --process-id K``: one dataset written by N
processes (machines, or jobs of an array), each encoding its share of the clips.

Process ``K`` takes the contiguous chunk ``[K n // N, (K + 1) n // N)`` of the folder's ``n``
captioned clips in file-name order and writes ``OUT/part-0000K-of-0000N/`` (the records of its
clips: ``<bucket>/data-*.array_record`` for a bucketed run, ``data-*.array_record`` for one
shape; its empty prompt's embedding; ``part.json``: the settings it ran with, its samples and
its skipped clips). The part is built in a hidden folder ``OUT/.part-0000K-of-0000N.partial-PID``
renamed when complete, so a part folder is always complete. The process that finds all N
parts complete writes ``OUT/meta.json`` over all of them (atomically: a temporary file renamed),
each bucket's files the parts' files concatenated in ``K`` order — so the dataset is the same,
record for record, whatever N (``num_processes`` and the files' paths aside).

Every process checks every caption (cheap) and the reference-image counts over all clips, and
reads the headers, frame counts and masks of its own chunk only. ``OUT`` may hold parts of the
same N (and the hidden folders of killed runs); parts of another N, other files, or parts
made with other settings (another model, buckets, text length, clip list...) are refused in
one line before any model loads. Re-running process K: when its part is complete it says so
and encodes nothing (then writes ``meta.json`` if all parts are there); when it is missing
(killed) the part is encoded again, alone — the other parts are kept. Once ``meta.json`` is
written, re-running any process says the dataset is complete and exits 0. Two processes must
not run with the same K at once (a re-run removes its K's stale hidden folders).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shutil

PART_FORMAT = "ditax-latents-part"
PART_JSON = "part.json"
MAX_PROCESSES = 99999        # part names have five digits
_PART = re.compile(r"part-(\d{5})-of-(\d{5})")
_TEMP = re.compile(r"\.part-(\d{5})-of-(\d{5})\.partial-\d+")
_OURS = re.compile(r"\.meta\.partial-\d+\.json|\.null_text\.partial-\d+\.safetensors|"
                   r"null_text\.safetensors")


def _fail(message: str):
    from ditax.errors import RequestError

    return RequestError(message)


def part_name(k: int, n: int) -> str:
    """``part-0000K-of-0000N``: process ``k`` of ``n``'s folder in the dataset."""
    return f"part-{k:05d}-of-{n:05d}"


def check_processes(num_processes, process_id) -> tuple[int, int]:
    """``(K, N)`` of ``--process-id K --num-processes N`` (both or neither; neither, or N = 1:
    ``(0, 1)``, one process writing the dataset itself); a wrong value is a
    :class:`~ditax.errors.RequestError` naming it and the fix."""
    if (num_processes is None) != (process_id is None):
        given = "--num-processes" if process_id is None else "--process-id"
        other = "--process-id K" if process_id is None else "--num-processes N"
        raise _fail(f"{given} needs {other} too: give both (process K of N, K from 0) or "
                    f"neither (one process)")
    if num_processes is None:
        return 0, 1
    for flag, v in (("--num-processes", num_processes), ("--process-id", process_id)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _fail(f"{flag}={v!r}: must be an integer")
    if not 1 <= num_processes <= MAX_PROCESSES:
        raise _fail(f"--num-processes={num_processes}: must be from 1 to {MAX_PROCESSES} (the "
                    f"processes that share the clips)")
    if not 0 <= process_id < num_processes:
        raise _fail(f"--process-id={process_id}: must be from 0 to {num_processes - 1} "
                    f"(--num-processes={num_processes}; ids count from 0)")
    return process_id, num_processes


def check_parts_output(output, n: int) -> str:
    """Check ``output`` for process parts of an ``n``-process run: ``"complete"`` when it
    holds the ``meta.json`` of an ``n``-process run, else ``"open"`` (new, empty, or holding
    only parts of ``n`` processes and their hidden folders); anything else is a
    :class:`~ditax.errors.RequestError` naming it."""
    from ditax.io.outputs import check_writable_parent

    out = pathlib.Path(output)
    if out.exists() and not out.is_dir():
        raise _fail(f"output {str(out)!r} is a file; give a folder for the dataset")
    if out.is_dir():
        meta = out / "meta.json"
        if meta.exists():
            try:
                made = json.loads(meta.read_text()).get("num_processes")
            except (OSError, ValueError, AttributeError):
                made = None
            if made == n:
                return "complete"
            raise _fail(f"output {str(out)!r} already holds a dataset (meta.json"
                        f"{f', written by {made} process(es)' if made else ''}); choose a new "
                        f"folder, or delete it first (rm -r {out})")
        other = []
        for e in sorted(out.iterdir()):
            m = _PART.fullmatch(e.name) or _TEMP.fullmatch(e.name)
            if m and e.is_dir():
                if int(m[2]) != n:
                    raise _fail(f"output {str(out)!r} holds {e.name}, a part of a {int(m[2])}-"
                                f"process run; this is --num-processes {n}: give "
                                f"--num-processes {int(m[2])}, or a new folder")
            elif not _OURS.fullmatch(e.name):
                other.append(e.name)
        if other:
            raise _fail(f"output {str(out)!r} holds files that are no parts of a {n}-process "
                        f"run ({', '.join(other[:3])}{', …' if len(other) > 3 else ''}); choose "
                        f"a new folder")
    check_writable_parent(out.absolute(), "output")
    return "open"


def clips_digest(samples) -> str:
    """A digest of the ``(path, caption)`` list (names and captions, in order): the parts of
    one dataset were cut from the same clip list."""
    h = hashlib.sha256()
    for path, caption in samples:
        h.update(f"{pathlib.Path(path).name}\0{caption}\n".encode())
    return h.hexdigest()[:16]


def read_part(folder) -> dict | None:
    """``part.json`` of a complete part folder, else None."""
    p = pathlib.Path(folder) / PART_JSON
    if not p.is_file():
        return None
    try:
        info = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("format") == PART_FORMAT else None


def check_settings(output, n: int, settings: dict) -> None:
    """Every complete part in ``output`` ran with ``settings`` (the model, family, dtype,
    sizes or buckets, text length, resize policy and clip list); else a
    :class:`~ditax.errors.RequestError` naming the part and the first setting that differs."""
    for k in range(n):
        info = read_part(pathlib.Path(output) / part_name(k, n))
        if info is None or info.get("settings") == settings:
            continue
        theirs = info.get("settings") or {}
        key = next((k2 for k2 in sorted(set(settings) | set(theirs))
                    if settings.get(k2) != theirs.get(k2)), "?")
        raise _fail(f"{part_name(k, n)} in {output} was made with {key}={theirs.get(key)!r}, "
                    f"this run has {key}={settings.get(key)!r}; run every process with the same "
                    f"command and clips, or delete that part to redo it")


def write_part(output, k: int, n: int, settings: dict, build, say=print) -> bool:
    """Build process ``k`` of ``n``'s part in a hidden folder and rename it to
    ``output/part-0000K-of-0000N`` with its ``part.json`` (``settings`` and what ``build(folder)``
    returns: ``num_samples``, ``meta`` — the chunk's own dataset meta, files relative to the
    part — and ``skipped``). A part already complete is left alone (False)."""
    from ditax.io.outputs import atomic_folder

    out = pathlib.Path(output)
    target = out / part_name(k, n)
    if read_part(target) is not None:
        say(f"{target.name} is complete already; nothing to encode for process {k} of {n}")
        return False
    for stale in out.glob(f".{part_name(k, n)}.partial-*"):    # a killed run of this K
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():          # not renamed by us (no part.json): never a complete part
        shutil.rmtree(target)
    with atomic_folder(target) as tmp:
        info = build(tmp)
        part = {"format": PART_FORMAT, "part": k, "num_processes": n, "settings": settings,
                **info}
        (tmp / PART_JSON).write_text(json.dumps(part, indent=1))
    return True


def merge_parts(output, n: int, say=print) -> pathlib.Path | None:
    """When all ``n`` parts in ``output`` are complete, write ``meta.json`` over them (and the
    empty prompt's embedding beside it) and return its path; else say which parts are
    missing and return None. A run in which no clip fits any bucket is refused here."""
    from ditax.io.outputs import atomic_file
    from ditax.train.bucket_writer import bucketed_meta, write_meta
    from ditax.train.data import NULL_TEXT
    from ditax.train.preprocess_buckets import no_fit_error

    out = pathlib.Path(output)
    parts = [read_part(out / part_name(k, n)) for k in range(n)]
    missing = [part_name(k, n) for k, p in enumerate(parts) if p is None]
    if missing:
        say(f"{n - len(missing)} of {n} parts complete; waiting for {', '.join(missing[:4])}"
            f"{', …' if len(missing) > 4 else ''} (the process that completes the last one "
            f"writes meta.json)")
        return None
    settings = parts[0]["settings"]
    check_settings(out, n, settings)
    skipped = [s for p in parts for s in p.get("skipped", [])]
    metas = [(part_name(k, n), p["meta"]) for k, p in enumerate(parts) if p.get("meta")]
    if not metas:
        raise no_fit_error(skipped)
    extra = {}
    null = next((out / name / NULL_TEXT for name, m in metas if m.get("null_text")), None)
    if null is not None:
        with atomic_file(out / NULL_TEXT) as tmp:
            shutil.copyfile(null, tmp)
        extra["null_text"] = NULL_TEXT
    first = metas[0][1]
    own = {k: v for k, v in first.items() if k not in _MERGED}
    if settings["kind"] == "buckets":
        meta = bucketed_meta(_merge_buckets(metas, settings["buckets"]), first["text_shape"],
                             {**extra, **own, "skipped": skipped, "num_processes": n})
    else:
        meta = {"format": first["format"], "version": first["version"],
                "num_samples": sum(m["num_samples"] for _, m in metas),
                "latent_shape": first["latent_shape"], "text_shape": first["text_shape"],
                "files": [f"{name}/{f}" for name, m in metas for f in m["files"]],
                **{k: v for k, v in own.items() if k != "condition"},
                "other_aspect_ratio": [f for _, m in metas for f in m["other_aspect_ratio"]],
                **extra, **({"condition": first["condition"]} if "condition" in first else {}),
                "num_processes": n}
    return write_meta(out, meta)


# entries of a part's meta that the merge recomputes (the rest is the same in every part)
_MERGED = ("format", "version", "num_samples", "latent_shape", "text_shape", "files",
           "buckets", "null_text", "skipped", "other_aspect_ratio", "num_processes")


def _merge_buckets(metas, order) -> list[dict]:
    """The buckets of every part's meta merged by name, in ``order``: counts summed, files
    concatenated in part order (paths relative to the dataset)."""
    merged: dict[str, dict] = {}
    for name, m in metas:
        for b in m["buckets"]:
            files = [f"{name}/{f}" for f in b["files"]]
            if b["name"] not in merged:
                merged[b["name"]] = {**b, "files": files}
            else:
                merged[b["name"]]["num_samples"] += b["num_samples"]
                merged[b["name"]]["files"] += files
    return [merged[k] for k in order if k in merged]


__all__ = ["check_parts_output", "check_processes", "check_settings", "clips_digest",
           "merge_parts", "part_name", "read_part", "write_part"]
