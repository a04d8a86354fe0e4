"""Resolve a model location: a local folder, a pipeline folder's subfolder, or a hub id."""

from __future__ import annotations

import os
import pathlib


from ditax.errors import ModelNotFound  # noqa: E402  (re-exported)


def resolve_folder(path_or_id: str | os.PathLike, subfolder: str | None = None,
                   required: tuple[str, ...] = ("config.json",)) -> pathlib.Path:
    """A local folder holding ``required`` files.

    Accepts the component folder itself, a pipeline folder with ``subfolder/``, or a hub id
    (``org/name``) fetched with huggingface_hub (offline: a clear error).
    """
    p = pathlib.Path(path_or_id).expanduser()
    if p.exists():
        cands = [p / subfolder, p] if subfolder else [p]
        for c in cands:
            if c.is_dir() and all((c / r).exists() for r in required):
                return c
        where = f"{p}" + (f" or {p / subfolder}" if subfolder else "")
        raise ModelNotFound(f"{where} has no {', '.join(required)}; point at a diffusers-format "
                            f"folder" + (f" (or a pipeline folder with {subfolder}/)"
                                         if subfolder else ""))
    s = str(path_or_id)
    if s.count("/") != 1 or s.startswith((".", "/")):
        raise ModelNotFound(f"{s!r} is neither an existing folder nor a hub id like "
                            f"'Wan-AI/Wan2.1-T2V-1.3B-Diffusers'")
    try:
        from huggingface_hub import snapshot_download

        patterns = None
        if subfolder:
            patterns = [f"{subfolder}/*", "model_index.json"]
        local = snapshot_download(s, allow_patterns=patterns)
    except Exception as e:  # offline, no such repo, gated...
        raise ModelNotFound(
            f"could not fetch {s!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            f"Offline? Download it elsewhere (huggingface-cli download {s}) and pass the "
            f"folder path") from None
    return resolve_folder(local, subfolder, required)
