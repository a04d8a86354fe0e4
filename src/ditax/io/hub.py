"""Resolve a model location: a local folder, a pipeline folder's subfolder, or a hub id.

The one resolver every loader uses (transformer, VAE, text encoder, tokenizer, scheduler,
pipeline): ``resolve_folder(path, "vae")`` accepts ``.../vae`` itself, a pipeline folder that has
``vae/``, or a hub id such as ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` (downloaded when online).
"""

from __future__ import annotations

import os
import pathlib

from ditax.errors import ModelNotFound


def _wanted(subfolder: str | None, required: tuple[str, ...]) -> str:
    """What a matching folder holds, for messages."""
    what = f"a folder with {', '.join(required)}"
    return what + (f" (or a pipeline folder with {subfolder}/)" if subfolder else "")


def resolve_folder(path_or_id: str | os.PathLike, subfolder: str | None = None,
                   required: tuple[str, ...] = ("config.json",)) -> pathlib.Path:
    """A local folder holding the ``required`` files.

    Accepts the component folder itself, a pipeline folder with ``subfolder/`` (tried first),
    or a hub id (``org/name``) fetched with huggingface_hub. Raises :class:`ModelNotFound`
    naming what was expected (offline or unknown hub id: how to download it).
    """
    p = pathlib.Path(path_or_id).expanduser()
    if p.exists():
        for c in ([p / subfolder, p] if subfolder else [p]):
            if c.is_dir() and all((c / r).exists() for r in required):
                return c
        where = f"{p}" + (f" or {p / subfolder}" if subfolder else "")
        raise ModelNotFound(f"{where} has no {', '.join(required)}; point at "
                            f"{_wanted(subfolder, required)} in diffusers format")
    s = str(path_or_id)
    if s.count("/") != 1 or s.startswith((".", "/")):
        raise ModelNotFound(f"{s!r} is neither an existing folder nor a hub id like "
                            f"'Wan-AI/Wan2.1-T2V-1.3B-Diffusers'; expected "
                            f"{_wanted(subfolder, required)}")
    try:
        from huggingface_hub import snapshot_download

        patterns = [f"{subfolder}/*", "model_index.json"] if subfolder else None
        local = snapshot_download(s, allow_patterns=patterns)
    except Exception as e:  # offline, no such repo, gated...
        raise ModelNotFound(
            f"could not fetch {s!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            f"Offline? Download it elsewhere (huggingface-cli download {s}) and pass the "
            f"folder path") from None
    return resolve_folder(local, subfolder, required)
