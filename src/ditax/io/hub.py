"""Resolve a model location: a local folder, a pipeline folder's subfolder, or a hub id.

The one resolver every loader uses (transformer, VAE, text encoder, tokenizer, scheduler,
pipeline): ``resolve_folder(path, "vae")`` accepts ``.../vae`` itself, a pipeline folder that has
``vae/``, or a hub id such as ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` (downloaded when online),
optionally pinned to a branch, tag or commit: ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers@<commit>``.
The ``@`` suffix rides along wherever a model path goes (``--model``, ``init_from=``,
``load_pipeline``, ``load_transformer``). Only JSON and safetensors files are downloaded.
"""

from __future__ import annotations

import os
import pathlib
import re

from ditax.errors import ModelNotFound

# What ditax reads from a hub repository: configs, weight indices, model_index.json and
# tokenizer.json (all JSON) and the weights (safetensors). Repositories often carry the same
# weights again as .bin / .pth / .ckpt / .gguf / ONNX files, and README media; none is fetched.
HUB_FILES = ("*.json", "*.safetensors", "*merges.txt")   # merges.txt: the CLIP tokenizer's

_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def _wanted(subfolder: str | None, required: tuple[str, ...]) -> str:
    """What a matching folder holds, for messages."""
    what = f"a folder with {', '.join(required)}"
    return what + (f" (or a pipeline folder with {subfolder}/)" if subfolder else "")


def resolve_folder(path_or_id: str | os.PathLike, subfolder: str | None = None,
                   required: tuple[str, ...] = ("config.json",),
                   revision: str | None = None) -> pathlib.Path:
    """A local folder holding the ``required`` files.

    Accepts the component folder itself, a pipeline folder with ``subfolder/`` (tried first),
    or a hub id (``org/name``, pinned with ``org/name@REVISION`` or ``revision``) fetched
    with huggingface_hub: only the files of :func:`hub_patterns`. Raises :class:`ModelNotFound`
    naming what was expected (offline or unknown hub id: how to download it).
    """
    from ditax.io.files import path_arg

    p = path_arg(path_or_id, "model path", ModelNotFound,
                 f"{_wanted(subfolder, required)} or a hub id").expanduser()
    if p.exists():
        for c in ([p / subfolder, p] if subfolder else [p]):
            if c.is_dir() and all((c / r).exists() for r in required):
                return c
        where = f"{p}" + (f" or {p / subfolder}" if subfolder else "")
        raise ModelNotFound(f"{where} has no {', '.join(required)}; point at "
                            f"{_wanted(subfolder, required)} in diffusers format")
    repo, rev = split_hub_id(path_or_id, revision)
    if repo is None:
        raise ModelNotFound(f"{str(path_or_id)!r} is neither an existing folder nor a hub id "
                            f"like 'Wan-AI/Wan2.1-T2V-1.3B-Diffusers'; expected "
                            f"{_wanted(subfolder, required)}")
    local = _download(repo, rev, hub_patterns(subfolder), str(path_or_id))
    return resolve_folder(local, subfolder, required)


def split_hub_id(path_or_id, revision: str | None = None) -> tuple[str | None, str | None]:
    """``"org/name@rev"`` → ``("org/name", "rev")``; ``(None, None)`` when it is no hub id.

    The revision (a branch, tag or commit) comes from the ``@`` suffix or ``revision``; both
    given and different is an error. No revision: the repository's default branch.
    """
    text = str(path_or_id)
    repo, at, suffix = text.partition("@")
    if repo.count("/") != 1 or repo.startswith((".", "/", "~")) or not all(
            _HUB_NAME.fullmatch(part) for part in repo.split("/")):
        return None, None
    if at and not suffix:
        raise ModelNotFound(f"{text!r}: empty revision after '@'; write {repo}@BRANCH, "
                            f"{repo}@TAG or {repo}@COMMIT, or drop the '@'")
    if at and revision is not None and revision != suffix:
        raise ModelNotFound(f"{text!r} pins revision {suffix!r} but revision={revision!r} "
                            f"was also given; give one")
    return repo, suffix or revision


def hub_patterns(subfolder: str | None) -> list[str]:
    """The files fetched from a hub repository: only those ditax reads (:data:`HUB_FILES`),
    of ``subfolder/`` (plus the pipeline's ``model_index.json``) or of the whole repo."""
    if subfolder is None:
        return list(HUB_FILES)
    return [f"{subfolder}/{pattern}" for pattern in HUB_FILES] + ["model_index.json"]


def _download(repo: str, revision: str | None, patterns: list[str], asked: str) -> str:
    """A local snapshot of ``repo`` at ``revision`` holding the files matching ``patterns``.

    Offline (``HF_HUB_OFFLINE=1``) only the local cache is read, so a missing model fails at
    once; a pinned commit already in the cache is used without asking the hub. Every failure
    is one :class:`ModelNotFound` line naming ``asked``.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision!r}" if revision else ""
    fetch = (f"hf download {repo}" + (f" --revision {revision}" if revision else "")
             + "".join(f" --include '{pattern}'" for pattern in patterns) + " --local-dir DIR")
    offline = bool(constants.HF_HUB_OFFLINE)
    if not offline and revision and _COMMIT.fullmatch(revision):
        try:
            return snapshot_download(repo, revision=revision, allow_patterns=patterns,
                                     local_files_only=True)
        except LocalEntryNotFoundError:
            pass
    try:
        return snapshot_download(repo, revision=revision, allow_patterns=patterns,
                                 local_files_only=offline)
    except GatedRepoError:
        raise ModelNotFound(f"{asked!r} is a gated hub repository: accept its terms on "
                            f"https://huggingface.co/{repo} and log in (hf auth login)") from None
    except RevisionNotFoundError:
        raise ModelNotFound(f"{asked!r}: the hub repository {repo!r} has no revision "
                            f"{revision!r}; give an existing branch, tag or commit") from None
    except RepositoryNotFoundError:
        raise ModelNotFound(f"{asked!r} is neither a local folder nor a repository on the "
                            f"Hugging Face hub (a private one needs hf auth login); check the "
                            f"path or the id") from None
    except LocalEntryNotFoundError:
        if offline:
            raise ModelNotFound(
                f"{asked!r} is neither a local folder nor in the Hugging Face cache "
                f"({constants.HF_HUB_CACHE}){at}, and HF_HUB_OFFLINE=1 forbids downloading it; "
                f"unset HF_HUB_OFFLINE, or run {fetch} where there is network and pass DIR") from None
        raise ModelNotFound(f"{asked!r} is neither a local folder nor reachable: the Hugging "
                            f"Face hub cannot be reached and it is not in the cache{at}; run "
                            f"{fetch} where there is network and pass DIR") from None
    except Exception as e:  # noqa: BLE001 — an HTTP or disk failure, reported in one line
        raise ModelNotFound(f"could not fetch {asked!r} from the Hugging Face hub{at} "
                            f"({type(e).__name__}: {_first_line(e)}); run {fetch} and pass DIR") from None


def _first_line(e: Exception) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), "")
