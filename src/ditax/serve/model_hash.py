"""A model folder's files as one short hash: what a job store keeps with each job
(:func:`folder_hash`: paths, sizes, modification times and small files' content, so replaced
weights give another hash) and what the processes of a group compare (content and sizes only:
another host's copy of the same folder hashes the same, :func:`~ditax.serve.group_start.
fingerprint`).
"""

from __future__ import annotations

import hashlib
import os
import pathlib

#: files of a model folder at most this large are hashed by content (configs, tokenizer files);
#: larger ones (weights) by name, size and modification time
CONTENT_BYTES = 1 << 20


def folder_hash(root, content_bytes: int = CONTENT_BYTES, times: bool = True) -> str:
    """A short hash of model folder ``root``'s files, cheap for any size: every file's path
    (relative), size and (``times``) modification time, and the content of the small ones
    (at most ``content_bytes``: configs) — so replaced weights or an edited config give another
    hash. Hidden files and folders (``.cache``, locks) are left out; a symlinked file counts as
    its target."""
    root = pathlib.Path(root)
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            path = pathlib.Path(folder, name)
            st = path.stat()
            stamp = f"{st.st_mtime_ns}\0" if times else ""
            h.update(f"{path.relative_to(root).as_posix()}\0{st.st_size}\0{stamp}".encode())
            if st.st_size <= content_bytes:
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


__all__ = ["CONTENT_BYTES", "folder_hash"]
