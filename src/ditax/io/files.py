"""Reading the small text files a user hands ditax — JSON (``config.json``,
``model_index.json``, ``meta.json``), JSON lines (``captions.jsonl``), YAML configs and plain
text (captions) — with errors that name the file and the line.

Every reader raises :class:`UnreadableFile` (a :class:`~ditax.errors.ConfigError`, so the
command line exits 2) or the ``error`` class its caller passes, with one message of the form
``FILE: line L, column C: what is wrong; the fix``. A missing file, a folder given for a file,
bad UTF-8 (the line is computed from the byte offset), a JSON / YAML syntax error and an empty
file are all reported this way, so no ``JSONDecodeError`` / ``UnicodeDecodeError`` /
``IsADirectoryError`` without a file name reaches the user.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from ditax.errors import ConfigError, RequestError


#: the fix for a damaged JSON file of a model folder
MODEL_FIX = "re-download the model or re-save it (diffusers' save_pretrained)"


class UnreadableFile(ConfigError):
    """A file ditax reads is missing, not a file, not UTF-8 or not valid JSON / YAML."""


class VideoReadError(RequestError):
    """A video cannot be decoded (not a video, empty, too few frames); names the clip."""


def _fail(error, path, problem: str, fix: str | None):
    return error(f"{path}: {problem}" + (f"; {fix}" if fix else ""))


def _where(line: int, column: int | None = None) -> str:
    return f"line {line}" + ("" if column is None else f", column {column}")


def path_arg(value, what: str, error=ConfigError, expected: str = "a path") -> pathlib.Path:
    """``value`` as a path, or ``error`` naming ``what`` when it is no path at all: not a
    ``str`` / ``os.PathLike`` (``None``, a number), or empty / blank text. Without this,
    ``pathlib.Path("")`` is ``.``, so an empty ``--model ""``, ``output_dir=`` or ``--lora ""``
    would silently mean the current folder."""
    import os

    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise error(f"{what}={value!r} is not a path ({type(value).__name__}); give "
                    f"{expected} as a string")
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise error(f"{what} is empty ({text!r}); give {expected}")
    return pathlib.Path(text)


def read_bytes(path, *, what: str = "file", fix: str | None = None, error=UnreadableFile) -> bytes:
    """The bytes of ``path``; a missing file, a folder or an unreadable file is ``error``
    naming it (``what``: how to call it in the message, e.g. ``"model config"``)."""
    p = pathlib.Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise _fail(error, p, f"{what} does not exist", fix) from None
    except IsADirectoryError:
        raise _fail(error, p, f"is a folder, not a {what}", fix) from None
    except NotADirectoryError:
        raise _fail(error, p, f"{what} does not exist (a part of its path is a file, "
                    "not a folder)", fix) from None
    except PermissionError:
        raise _fail(error, p, f"{what} cannot be read (permission denied)", fix) from None
    except OSError as e:
        raise _fail(error, p, f"{what} cannot be read ({e.strerror or e})", fix) from None


def read_text(path, *, what: str = "file", fix: str | None = None, error=UnreadableFile) -> str:
    """``path`` decoded as UTF-8 (a BOM is dropped); bad bytes are ``error`` naming the
    line and column where they start."""
    data = read_bytes(path, what=what, fix=fix, error=error)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise _fail(error, path, f"{_where(line, column)}: {what} is not UTF-8 text (byte "
                    f"0x{data[e.start]:02x})", "save it as UTF-8") from None


def parse_json(text: str, path, *, what: str = "JSON file", fix: str | None = None,
               error=UnreadableFile, line: int | None = None) -> Any:
    """``json.loads(text)``; a syntax error is ``error`` naming ``path`` and the line
    (``line``: the text is that line of the file, as in a JSON-lines file)."""
    if not text.strip():
        raise _fail(error, path, (f"{_where(line)}: " if line else "") + f"{what} is empty",
                    fix)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        at = _where(line or e.lineno, e.colno)
        raise _fail(error, path, f"{at}: {what} is not valid JSON ({e.msg})", fix) from None
    except RecursionError:
        raise _fail(error, path, f"{what} nests too deeply to read", fix) from None


def read_json(path, *, what: str = "JSON file", fix: str | None = None,
              error=UnreadableFile) -> Any:
    """The JSON value in ``path``; every way it can be unreadable is ``error`` naming it."""
    return parse_json(read_text(path, what=what, fix=fix, error=error), path, what=what,
                      fix=fix, error=error)


def read_json_object(path, *, what: str = "JSON file", fix: str | None = None,
                     error=UnreadableFile) -> dict:
    """:func:`read_json` of a file whose top level must be an object (``{...}``)."""
    value = read_json(path, what=what, fix=fix, error=error)
    if not isinstance(value, dict):
        raise _fail(error, path, f"{what} holds a JSON {type(value).__name__}, not an object "
                    "({...})", fix)
    return value


def read_model_json(path, what: str = "model config") -> dict:
    """A model folder's JSON object (``config.json``, ``model_index.json`` …), an unreadable
    one being :class:`UnreadableFile` with the fix :data:`MODEL_FIX`."""
    return read_json_object(path, what=what, fix=MODEL_FIX)


def read_json_lines(path, *, what: str = "JSON-lines file", fix: str | None = None,
                    error=UnreadableFile) -> list[tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line of a JSON-lines file."""
    text = read_text(path, what=what, fix=fix, error=error)
    return [(n, parse_json(line, path, what=what, fix=fix, error=error, line=n))
            for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def read_yaml(path, *, what: str = "YAML file", fix: str | None = None,
              error=UnreadableFile) -> Any:
    """The YAML document in ``path`` (``None`` when empty); a syntax error is ``error``
    naming the line and column."""
    import yaml

    text = read_text(path, what=what, fix=fix, error=error)
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"{_where(mark.line + 1, mark.column + 1)}: " if mark is not None else ""
        problem = " ".join(str(x) for x in (e.context, e.problem) if x) or "syntax error"
        raise _fail(error, path, f"{at}{what} is not valid YAML ({problem})", fix) from None
    except (yaml.YAMLError, RecursionError) as e:
        raise _fail(error, path, f"{what} is not valid YAML ({e})", fix) from None


def ffmpeg_problem(err: BaseException) -> str:
    """The line of an ffmpeg / imageio-ffmpeg error that says what went wrong, without the
    version banner and build configuration ffmpeg prints first."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("ffmpeg version", "built with",
                                                       "configuration:", "lib", "==="))]
    text = useful[-1] if useful else (lines[0] if lines else type(err).__name__)
    if text.startswith("[") and "] " in text:      # "[in#0 @ 0x55...] Error ..." → "Error ..."
        text = text.split("] ", 1)[1]
    return text


def video_error(path, err: BaseException | None = None, problem: str | None = None,
                fix: str | None = None) -> VideoReadError:
    """The :class:`VideoReadError` for a clip ffmpeg could not read (``err``) or that is
    unusable for ``problem``; an empty (0-byte) file is said to be empty."""
    p = pathlib.Path(path)
    if problem is None:
        try:
            empty = p.stat().st_size == 0
        except OSError:
            empty = False
        if not p.exists():
            problem, fix = "video does not exist", fix or "check the path"
        elif p.is_dir():
            problem, fix = "is a folder, not a video", fix or "give a video file"
        elif empty:
            problem = "video file is empty (0 bytes)"
        else:
            problem = f"cannot be read as a video ({ffmpeg_problem(err) if err else 'unknown'})"
    return VideoReadError(f"{p}: {problem}; " + (fix or "re-encode it (e.g. ffmpeg -i IN "
                                                  "-c:v libx264 OUT.mp4) or remove it"))


def folder_vae_json(root) -> dict | None:
    """``root/vae/config.json`` as a dict (None: no folder, or no such file: a hub id); the
    families read their VAE factor from it (FLUX.1 and FLUX.2 alike)."""
    cfg = pathlib.Path(root) / "vae" / "config.json" if root is not None else None
    return read_model_json(cfg, "vae/config.json") if cfg and cfg.is_file() else None


__all__ = ["MODEL_FIX", "read_model_json", "folder_vae_json", "UnreadableFile", "VideoReadError",
           "read_bytes", "read_text", "parse_json", "read_json", "read_json_object", "read_json_lines", "read_yaml", "ffmpeg_problem",
           "video_error"]
