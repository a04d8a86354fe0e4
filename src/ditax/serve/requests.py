"""A ``POST /v1/videos`` body → the checked pipeline call, by ``ditax generate``'s own checks.

The JSON fields are the request fields of the served model's family
(:mod:`ditax.pipelines.request`: the common ones and the family's own, each by its JSON name)
plus what only HTTP has (``size`` as ``"WxH"``, base64 ``image`` / ``last_image`` — ``image`` a
list of them for a family whose ``image`` is its reference images, FLUX.2's — ``loras``,
``cache``, ``model``). Each value is checked for its type and limits first (a bool is not a
number, ``"17"`` is not an int, NaN is not finite; :class:`Limits` bound the work), with a
message naming the JSON field; then the request goes through the front door as ``ditax
generate``'s flags do (:func:`ditax.front.resolve`: the folder's sample defaults, the family's
request checks, ``sample.*`` overrides), told to name fields as the API does, and the family's
:func:`~ditax.pipelines.family.preflight`. No field becomes a path or a shell
argument: images are decoded in memory, ``cache`` must be a plain word.
"""

from __future__ import annotations

import base64
import binascii
import io
import pathlib
import re
from dataclasses import dataclass

from ditax.errors import RequestError

#: ``ditax serve --batching``: rows join the running batch between steps (``continuous``),
#: queued jobs of one key start and end together (``static``), or every job alone (``off``)
BATCHING = ("continuous", "static", "off")
# the fields every server takes besides its family's request fields (by JSON name)
HTTP_FIELDS = ("size", "image", "last_image", "loras", "cache", "model")
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
    """What one request may hold (413 past the sizes of its text and images; 400 past the
    work it asks for: ``ditax serve --max-steps / --max-pixels / --max-frames``)."""

    prompt_chars: int = 2000
    image_bytes: int = 8 << 20         # one decoded image
    reference_images: int = 10         # images in one request's list (FLUX.2's references)
    body_bytes: int = 24 << 20         # the whole JSON body
    max_steps: int = 200               # denoising steps of one request
    max_pixels: int = 2048 * 2048      # height x width of one output
    max_frames: int = 241              # frames of one video


def check_limits(values: dict, fields, limits: Limits) -> None:
    """The request's work within the server's :class:`Limits` (each field names the limit
    that bounds it); a :class:`BadRequest` naming the field, the limit and its flag."""
    for f in fields:
        v = values.get(f.name)
        if f.limit is None or v is None:
            continue
        if f.limit == "max_pixels":
            h, w = values.get("height"), values.get("width")
            if h is not None and w is not None and h * w > limits.max_pixels:
                raise BadRequest(f"size={w}x{h} is {h * w} pixels, more than this server's "
                                 f"--max-pixels {limits.max_pixels}; ask for a smaller size",
                                 "size")
            continue
        most = getattr(limits, f.limit)
        if v > most:
            flag = "--" + f.limit.replace("_", "-")
            raise BadRequest(f"{f.api}={v} is more than this server's {flag} {most}; ask for "
                             f"at most {most}", f.api)


@dataclass(frozen=True)
class Checked:
    """A request that passed: ``call`` (the pipeline call's keyword arguments, images as PIL
    images), ``stored`` (what the job row keeps: the call's values, images as base64),
    ``batch_key`` (jobs with equal keys may share one batch; None: this one runs alone) and
    ``load`` (the served model's :class:`~ditax.front.LoadRequest`: what the server loads)."""

    call: dict
    stored: dict
    batch_key: str | None
    load: object


def lora_strengths(given, names: tuple) -> list[float]:
    """A request's ``loras`` (``[{"name", "strength"}]``) → one strength per served LoRA
    (0 for those not named)."""
    import math

    from ditax.lora import MAX_STRENGTH

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
        if not isinstance(item, dict):
            raise BadRequest(f"loras item {item!r}: each item must be an object "
                             f"{{\"name\": str, \"strength\": number}}, e.g. "
                             f"{{\"name\": \"{names[0]}\", \"strength\": 0.8}}", "loras")
        name = item.get("name")
        strength = item.get("strength", 1.0) if isinstance(item, dict) else None
        if name not in out:
            raise BadRequest(f"lora {name!r} is not held by this server; GET /v1/loras lists "
                             f"{', '.join(names)}", "loras")
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or \
                not math.isfinite(strength) or abs(strength) > MAX_STRENGTH:
            raise BadRequest(f"lora {name!r} strength={strength!r} must be a finite number in "
                             f"[-{MAX_STRENGTH:g}, {MAX_STRENGTH:g}] (1 = as trained, 0 = off)",
                             "loras")
        out[name] = float(strength)
    return list(out.values())


def param_of(message: str, fields=()) -> str | None:
    """The JSON field a check message of ``generate`` names: a request field's name (``fields``,
    the family's) or one of generate's words (its first word that is one)."""
    head = re.split(r"[= ]", message, maxsplit=1)[0]
    for f in fields:
        if head in (f.name, f.api, f.cli):
            return "size" if f.name in ("height", "width") else f.api or None
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


def check_body(body, model: str, overrides: list[str], output: str,
               limits: Limits = Limits(), loras: tuple = (), lora_files: tuple = (),
               makes: str | None = None, pipelines=None, startup: bool = False) -> Checked:
    """Check a request body against the served ``model`` (path) and the server's ``key=value``
    ``overrides``; ``output`` names a writable file of the output folder (generate checks its
    ``--output``); ``loras``: the names of the LoRAs the
    server holds (unmerged, in order; a request's ``loras`` become one strength per name,
    ``stored["lora_strengths"]``); ``lora_files``: their files, read and checked by generate's
    ``--lora`` rules (the server's startup check); ``pipelines``: the served folder's family
    (:class:`~ditax.pipelines.family.PipelineFamily`; None: read from the folder), whose
    request fields the body may hold and whose ``makes`` names the output (``makes``, if given,
    must agree); ``startup``: the server's own check of its settings with a prompt-only body
    (the folder and the attention backend are checked, not the request's fit — an
    image-to-video folder needs each request's image). Raises :class:`BadRequest`."""
    from ditax.errors import DitaxError
    from ditax.front import resolve
    from ditax.pipelines.family import folder_pipelines, preflight
    from ditax.pipelines.request import all_fields, fields_of, not_taken

    if pipelines is None:
        pipelines = folder_pipelines(model)[1]
    makes = makes or pipelines.makes
    fields = {f.api: f for f in fields_of(pipelines) if f.api}
    allowed = (*fields, *HTTP_FIELDS)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object, e.g. {\"prompt\": \"a cat\"}")
    for key in sorted(set(body) - set(allowed)):
        if any(f.api == key for f, _ in all_fields().values()):
            raise BadRequest(str(not_taken(pipelines, key, "api", key,
                                           f"this server's model makes {makes}s")), key)
        raise BadRequest(f"unknown field {key!r}; the fields are {', '.join(allowed)}", key)
    served = body.get("model")
    if served is not None and served not in (str(model), pathlib.Path(str(model)).name):
        raise BadRequest(f"model={served!r}: this server serves {pathlib.Path(str(model)).name} "
                         f"({model}); drop model or send {pathlib.Path(str(model)).name!r}",
                         "model")
    if "prompt" not in body:
        raise BadRequest("prompt is missing; send {\"prompt\": \"a cat walks on the grass\"}",
                         "prompt")
    for name in ("prompt", "negative_prompt"):
        text = body.get(name)
        if isinstance(text, str) and len(text) > limits.prompt_chars:
            raise BadRequest(f"{name} has {len(text)} characters, more than this server's "
                             f"{limits.prompt_chars}; shorten it", name, 413)
    # the values as sent: the front door checks their types (naming the JSON field)
    values = {f.name: body[name] for name, f in fields.items() if name in body}
    strengths = lora_strengths(body.get("loras"), loras)
    if body.get("size") is not None:
        values["height"], values["width"] = parse_size(body["size"])
    cache = body.get("cache")
    extra = []
    if cache is not None:
        if not isinstance(cache, str) or not re.fullmatch(r"[a-z_]{1,32}", cache):
            raise BadRequest(f"cache={cache!r} must be a step-cache name (first_block, "
                             f"teacache, magcache) or omitted", "cache")
        extra = [f"sample.cache={cache}"]
    images = {k: _decode_images(body[k], k, limits, pipelines.reference_images)
              for k in ("image", "last_image") if body.get(k) is not None}
    for k in images:
        if k not in pipelines.cli_inputs:
            raise BadRequest(str(not_taken(pipelines, k, "api", k, f"this server's model "
                                           f"makes {makes}s from text")), k)
    if "last_image" in images and "image" not in images:
        raise BadRequest("last_image needs image (the first frame) too", "last_image")
    output = str(pathlib.Path(output).with_suffix(".png" if makes == "image" else ".mp4"))
    given = dict(values, lora=[f"{f}:0" for f in lora_files],
                 lora_mode="unmerged" if loras else "merged", lora_strict=True, output=output)
    try:
        req = resolve(model, [*overrides, *extra], given, "api")
        load, call = req.load, req.kwargs()
        if load.makes != makes:
            raise BadRequest(f"{model} makes {load.makes}s, not {makes}s; restart ditax serve "
                             f"on it")
        check_limits(call, fields_of(pipelines), limits)
        call.update(images)
        preflight(load.path, load.kwargs(), None if startup else call, None)
    except BadRequest:
        raise
    except DitaxError as e:
        raise BadRequest(str(e), param_of(str(e), fields.values())) from None
    stored = {k: list(v) if isinstance(v, tuple) else v for k, v in call.items()
              if k not in images}
    stored["fps"] = req.output.fps
    if loras:
        stored["lora_strengths"] = strengths
    for k in images:
        stored[k] = body[k]
    # every stored value that shapes the program, none of a row's own (texts, seed, image
    # contents: only whether each is given; fps: its own file's; LoRA strengths: each row
    # applies its own unmerged), for any family
    from ditax.pipelines.batch import batch_key

    # (reference images: their sizes, which set their token counts)
    sizes = {k: [list(im.size) for im in (v if isinstance(v, list) else [v])]
             for k, v in images.items()} if pipelines.reference_images else {}
    key = batch_key({**{k: v for k, v in stored.items() if k not in ("fps", "lora_strengths")},
                     **sizes}, given=tuple(k for k in images if k not in sizes))
    return Checked(call, stored, key, load)


def _decode_images(value, name: str, limits: Limits, several: bool):
    """A request's image field: one base64 image, or with ``several`` (a family whose
    ``image`` is its reference images) a non-empty list of them, each decoded."""
    if not several or not isinstance(value, list):
        return decode_image(value, name, limits.image_bytes)
    if not value or len(value) > limits.reference_images:
        raise BadRequest(f"{name} holds {len(value)} images; send 1 to "
                         f"{limits.reference_images} base64 images", name)
    return [decode_image(v, f"{name}[{i}]", limits.image_bytes) for i, v in enumerate(value)]


def call_of(stored: dict, limits: Limits = Limits()) -> dict:
    """A stored job request → the pipeline call's keyword arguments (images decoded)."""
    call = {k: v for k, v in stored.items() if k not in ("fps", "lora_strengths")}
    for k in ("image", "last_image"):
        if stored.get(k) is not None:
            v = stored[k]
            call[k] = ([decode_image(t, k, limits.image_bytes) for t in v] if isinstance(v, list)
                       else decode_image(v, k, limits.image_bytes))
    return call


__all__ = ["BadRequest", "Checked", "HTTP_FIELDS", "Limits", "call_of", "check_body", "check_limits",
           "decode_image", "param_of", "parse_size"]
