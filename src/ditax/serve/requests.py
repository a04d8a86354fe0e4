"""A ``POST /v1/videos`` body → the checked pipeline call, by ``ditax generate``'s own checks.

The JSON fields are mapped onto ``generate``'s flags and the request goes through the same
functions ``ditax generate`` runs before it loads anything — its ``parse_request`` (handed in
by :mod:`ditax.cli.serve`, the composition root, so this package does not import the CLI: the
folder's sample defaults, the family's request checks, seed, sigmas, ``sample.*`` overrides)
and the family's :func:`~ditax.pipelines.family.preflight` (images vs
the folder's kind, the latent grid, the attention backend) — so a bad request gets the very
words ``generate`` prints. Only what HTTP adds is checked here: the JSON shape, unknown fields,
``size`` as ``"WxH"``, the limits of :class:`Limits` (413) and base64 images. No field becomes a
path or a shell argument: images are decoded in memory, ``cache`` must be a plain word.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import io
import pathlib
import re
from dataclasses import dataclass

from ditax.errors import RequestError

FIELDS = ("prompt", "negative_prompt", "size", "num_frames", "num_inference_steps",
          "guidance_scale", "seed", "image", "last_image", "loras", "cache", "model")
# the request values a job stores (and shows back), besides the images
CALL_KEYS = ("prompt", "negative_prompt", "height", "width", "num_frames",
             "num_inference_steps", "guidance_scale", "guidance_scale_2", "seed")
# the words of generate's check messages -> the JSON field they are about
_PARAMS = (("negative_prompt", "negative_prompt"), ("prompt", "prompt"),
           ("height", "size"), ("width", "size"), ("num_frames", "num_frames"),
           ("--frames", "num_frames"), ("num_inference_steps", "num_inference_steps"),
           ("--steps", "num_inference_steps"), ("guidance_scale", "guidance_scale"),
           ("seed", "seed"), ("--image", "image"), ("--last-image", "last_image"),
           ("sample.cache", "cache"), ("cache", "cache"))


class BadRequest(RequestError):
    """A request the server refuses before queueing it: HTTP ``status`` (400 or 413), the
    message, and the JSON field it is about (``param``, None when none)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


@dataclass(frozen=True)
class Limits:
    """What one request may hold (413 past it)."""

    prompt_chars: int = 2000
    image_bytes: int = 8 << 20         # one decoded image
    body_bytes: int = 24 << 20         # the whole JSON body


@dataclass(frozen=True)
class Checked:
    """A request that passed: ``call`` (the pipeline call's keyword arguments, images as PIL
    images), ``stored`` (what the job row keeps: the call's values, images as base64),
    ``batch_key`` (jobs with equal keys may share one batch; None: this one runs alone) and
    ``load`` (generate's load arguments of the served model: what the server loads)."""

    call: dict
    stored: dict
    batch_key: str | None
    load: dict


def lora_strengths(given, names: tuple) -> list[float]:
    """A request's ``loras`` (``[{"name", "strength"}]``) → one strength per served LoRA
    (0 for those not named)."""
    import math

    if not given:
        return [0.0] * len(names)
    if not names:
        raise BadRequest("loras: this server holds no LoRAs (start it with --lora-dir DIR); "
                         "drop loras", "loras")
    if not isinstance(given, list):
        raise BadRequest("loras must be a list of {\"name\": str, \"strength\": number}",
                         "loras")
    out = dict.fromkeys(names, 0.0)
    for item in given:
        name = item.get("name") if isinstance(item, dict) else None
        strength = item.get("strength", 1.0) if isinstance(item, dict) else None
        if name not in out:
            raise BadRequest(f"lora {name!r} is not held by this server; GET /v1/loras lists "
                             f"{', '.join(names)}", "loras")
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or \
                not math.isfinite(strength):
            raise BadRequest(f"lora {name!r} strength={strength!r} must be a finite number "
                             f"(1 = as trained, 0 = off)", "loras")
        out[name] = float(strength)
    return list(out.values())


def param_of(message: str) -> str | None:
    """The JSON field a check message of ``generate`` names (its first word that is one)."""
    head = message.split(" ", 1)[0]
    for word, param in _PARAMS:
        if head.startswith(word):
            return param
    for word, param in _PARAMS:
        if word in message:
            return param
    return None


def parse_size(size) -> tuple[int, int]:
    """``"WxH"`` → ``(height, width)``."""
    m = re.fullmatch(r"\s*(\d{1,6})\s*[xX×]\s*(\d{1,6})\s*", size) if isinstance(size, str) else None
    if m is None:
        raise BadRequest(f"size={size!r} must be 'WIDTHxHEIGHT', e.g. '832x480'", "size")
    return int(m.group(2)), int(m.group(1))


def decode_image(text, name: str, limit: int):
    """A base64 PNG / JPEG / WebP (a ``data:image/...;base64,`` prefix allowed) → PIL image."""
    import PIL.Image

    if not isinstance(text, str):
        raise BadRequest(f"{name} must be a base64 string of a PNG / JPEG image", name)
    if text.startswith("data:"):
        text = text.split(",", 1)[-1]
    if len(text) * 3 // 4 > limit:
        raise BadRequest(f"{name} is over {limit} bytes; send a smaller image", name, 413)
    try:
        data = base64.b64decode(text, validate=True)
        with PIL.Image.open(io.BytesIO(data)) as im:
            im.load()
            return im.copy()
    except (binascii.Error, ValueError, OSError, PIL.UnidentifiedImageError, SyntaxError) as e:
        raise BadRequest(f"{name} is not a readable base64 PNG / JPEG / WebP image ({e})",
                         name) from None


def check_body(body, model: str, overrides: list[str], output: str, parse_request,
               limits: Limits = Limits(), loras: tuple = (), lora_files: tuple = (),
               makes: str = "video") -> Checked:
    """Check a request body against the served ``model`` (path) and the server's ``key=value``
    ``overrides``; ``output`` names a writable file of the output folder (generate checks its
    ``--output``); ``parse_request``: ``ditax generate``'s (:func:`ditax.cli.generate.
    parse_request`: ``args`` → ``(load, call)``); ``loras``: the names of the LoRAs the
    server holds (unmerged, in order; a request's ``loras`` become one strength per name,
    ``stored["lora_strengths"]``); ``lora_files``: their files, read and checked by generate's
    ``--lora`` rules (the server's startup check); ``makes``: ``"video"`` or ``"image"`` (the
    folder family's ``makes``: an image model's request is ``generate``'s PNG request, and its
    video-only fields — ``num_frames``, ``image``, ``last_image``, ``negative_prompt`` — are
    refused with the words of ``generate``'s video flags). Raises :class:`BadRequest`."""
    from ditax.errors import DitaxError
    from ditax.pipelines.family import preflight

    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object, e.g. {\"prompt\": \"a cat\"}")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}; the fields are {', '.join(FIELDS)}",
                         unknown[0])
    if "prompt" not in body:
        raise BadRequest("prompt is missing; send {\"prompt\": \"a cat walks on the grass\"}",
                         "prompt")
    for name in ("prompt", "negative_prompt"):
        text = body.get(name)
        if isinstance(text, str) and len(text) > limits.prompt_chars:
            raise BadRequest(f"{name} has {len(text)} characters, more than this server's "
                             f"{limits.prompt_chars}; shorten it", name, 413)
    strengths = lora_strengths(body.get("loras"), loras)
    height = width = None
    if body.get("size") is not None:
        height, width = parse_size(body["size"])
    cache = body.get("cache")
    extra = []
    if cache is not None:
        if not isinstance(cache, str) or not re.fullmatch(r"[a-z_]{1,32}", cache):
            raise BadRequest(f"cache={cache!r} must be a step-cache name (first_block, "
                             f"teacache, magcache) or omitted", "cache")
        extra = [f"sample.cache={cache}"]
    images = {k: decode_image(body[k], k, limits.image_bytes)
              for k in ("image", "last_image") if body.get(k) is not None}
    if "last_image" in images and "image" not in images:
        raise BadRequest("last_image needs image (the first frame) too", "last_image")
    image_model = makes == "image"
    output = str(pathlib.Path(output).with_suffix(".png" if image_model else ".mp4"))
    args = argparse.Namespace(   # an image model's generate refuses --image / --last-image
        model=model, prompt=body["prompt"], negative_prompt=body.get("negative_prompt"),
        image="image" if image_model and "image" in images else None,
        last_image="last_image" if image_model and "last_image" in images else None,
        height=height, width=width,
        frames=body.get("num_frames"), steps=body.get("num_inference_steps"),
        guidance=body.get("guidance_scale"), guidance_2=None,
        lora=[f"{f}:0" for f in lora_files], lora_2=[],
        lora_mode="unmerged" if loras else "merged", lora_strict=True,
        seed=body.get("seed", 0) if body.get("seed") is not None else 0,
        output=output, frames_dir=None, fps=None, no_progress=True,
        overrides=[*overrides, *extra])
    try:
        load, call = parse_request(args)
        if load.get("makes", "video") != makes:
            raise BadRequest(f"{model} makes {load.get('makes', 'video')}s, not {makes}s; "
                             f"restart ditax serve on it")
        call.update(images)
        preflight(load["path"], load, call, None)
    except BadRequest:
        raise
    except DitaxError as e:
        raise BadRequest(str(e), param_of(str(e))) from None
    stored = {k: list(v) if isinstance(v, tuple) else v for k, v in call.items()
              if k not in images}
    stored["fps"] = args.fps
    if loras:
        stored["lora_strengths"] = strengths
    for k in images:
        stored[k] = body[k]
    # every stored value that shapes the program, none of a row's own (texts, seed, image
    # contents: only whether each is given; fps: its own file's), for any family
    from ditax.pipelines.batch import batch_key

    key = batch_key({k: v for k, v in stored.items() if k != "fps"}, given=tuple(images))
    return Checked(call, stored, key, load)


def call_of(stored: dict, limits: Limits = Limits()) -> dict:
    """A stored job request → the pipeline call's keyword arguments (images decoded)."""
    call = {k: v for k, v in stored.items() if k not in ("fps", "lora_strengths")}
    for k in ("image", "last_image"):
        if stored.get(k) is not None:
            call[k] = decode_image(stored[k], k, limits.image_bytes)
    return call


__all__ = ["BadRequest", "CALL_KEYS", "Checked", "FIELDS", "Limits", "call_of", "check_body",
           "decode_image", "param_of", "parse_size"]
