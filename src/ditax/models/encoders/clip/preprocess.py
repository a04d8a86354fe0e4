"""``CLIPImageProcessor`` preprocessing as Wan's image-to-video pipeline calls it, on the host.

Per image, as transformers' PIL backend does it (the backend ``CLIPImageProcessor`` uses when
torchvision is absent, and the only one of transformers 4.x):
convert to RGB (alpha composited onto white) → resize the shortest edge to ``size`` with PIL
(bicubic for CLIP; a float image makes a round trip through uint8, truncated, as upstream) →
center crop (zero padding where the image is smaller) → rescale by ``rescale_factor`` in
float64, stored float32 → normalize with ``image_mean`` / ``image_std`` in float32.
Output ``pixel_values`` float32 ``[B, 3, crop_h, crop_w]``, channels first like upstream.

With torchvision installed, transformers 5's ``CLIPImageProcessor`` resizes with torchvision
instead (a slightly different bicubic); diffusers' pipeline then differs from this by that.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import PIL.Image

from ditax.errors import ConfigError, RequestError, check_choice
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# keys of a preprocessor_config.json that name things but change nothing
_INFORMATIONAL = {"image_processor_type", "feature_extractor_type", "processor_class",
                  "_processor_class"}
FLOAT_MODES = ("unit", "diffusers")


@dataclass(frozen=True)
class CLIPImageProcessorConfig:
    """The processor settings (``image_processor/preprocessor_config.json``), CLIP defaults.

    ``shortest_edge`` resizes keeping the aspect ratio; ``resize_to`` = ``(height, width)``
    resizes to a fixed size instead (a config ``size`` of ``{"height", "width"}``).
    ``resample`` is a PIL filter id (3 = bicubic).
    """

    do_convert_rgb: bool = True
    do_resize: bool = True
    shortest_edge: int | None = 224
    resize_to: tuple[int, int] | None = None
    resample: int = 3
    do_center_crop: bool = True
    crop_size: tuple[int, int] = (224, 224)
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = OPENAI_CLIP_STD

    @classmethod
    def from_dict(cls, d: dict) -> "CLIPImageProcessorConfig":
        """From a ``preprocessor_config.json`` dict (transformers' forms of ``size`` and
        ``crop_size``: an int, a ``[h, w]`` list or a dict). Raises :class:`ConfigError`
        naming a key or value this preprocessing does not implement."""
        plain = {f.name for f in dataclasses.fields(cls)} - {"shortest_edge", "resize_to"}
        known = plain | {"size", "default_to_square", "do_pad"} | _INFORMATIONAL
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"preprocessor_config.json has key(s) {unknown} that ditax's CLIP "
                              f"preprocessing does not implement; it reads {sorted(known)}")
        if d.get("do_pad"):
            raise ConfigError("preprocessor_config.json has do_pad=true; CLIP preprocessing "
                              "pads nothing: set it to false")
        kw = {k: d[k] for k in plain if k in d and k != "crop_size"}
        for k in ("image_mean", "image_std"):
            if k in kw:
                kw[k] = tuple(kw[k]) if isinstance(kw[k], (list, tuple)) else (kw[k],) * 3
        if "crop_size" in d:
            kw["crop_size"] = _hw(d["crop_size"], "crop_size", square=True)
        if "size" in d:
            size = d["size"]
            square = bool(d.get("default_to_square", False))
            if isinstance(size, dict) and "shortest_edge" in size and len(size) == 1:
                kw.update(shortest_edge=int(size["shortest_edge"]), resize_to=None)
            elif isinstance(size, int) and not square:
                kw.update(shortest_edge=size, resize_to=None)
            else:
                kw.update(shortest_edge=None, resize_to=_hw(size, "size", square=square))
        out = cls(**kw)
        check_choice("resample", out.resample, tuple(range(6)))
        return out


def _hw(v, name: str, square: bool) -> tuple[int, int]:
    """transformers' size forms → ``(height, width)``."""
    if isinstance(v, dict) and set(v) == {"height", "width"}:
        return int(v["height"]), int(v["width"])
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return int(v[0]), int(v[1])
    if isinstance(v, int) and square:
        return v, v
    raise ConfigError(f"preprocessor_config.json {name}={v!r} is not supported; use "
                      f'{{"height": H, "width": W}}' + (' or {"shortest_edge": S}'
                                                         if name == "size" else ""))


def load_image_processor(path) -> CLIPImageProcessorConfig:
    """Read ``preprocessor_config.json`` from a folder, a pipeline folder's
    ``image_processor/`` or a hub id."""
    folder = resolve_folder(path, "image_processor", required=("preprocessor_config.json",))
    return CLIPImageProcessorConfig.from_dict(
        read_model_json(folder / "preprocessor_config.json", "image processor config"))


def _rescale(x: np.ndarray, scale: float) -> np.ndarray:
    """``x * scale`` in float64, stored float32 (upstream's rescale)."""
    return (x.astype(np.float64) * scale).astype(np.float32)


def _rgb(image, cfg: CLIPImageProcessorConfig) -> np.ndarray:
    """A PIL image → ``[H, W, 3]`` uint8 (alpha composited onto white)."""
    if cfg.do_convert_rgb:
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            white = PIL.Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = PIL.Image.alpha_composite(white, rgba)
        image = image.convert("RGB")
    elif image.mode != "RGB":
        raise RequestError(f"image mode {image.mode!r} is not RGB and the processor has "
                           f"do_convert_rgb=false; convert the image to RGB first")
    return np.array(image)


def _to_uint8(x: np.ndarray, floats: str) -> tuple[np.ndarray, bool]:
    """An array image → (uint8 for PIL, whether it was scaled by 255 on the way).

    ``diffusers``: upstream's rule — integer-valued arrays in [0, 255] are pixel values,
    other floats in [0, 1] are scaled; ``unit``: every float array is in [0, 1].
    """
    if x.dtype == np.uint8:
        return x, False
    lo, hi = float(x.min()), float(x.max())
    integral = not np.issubdtype(x.dtype, np.floating) or (
        floats == "diffusers" and np.allclose(x, x.astype(int)))
    if integral:
        if lo < 0 or hi > 255:
            raise RequestError(f"image values span [{lo}, {hi}]; integer pixels must be in "
                               f"[0, 255]")
        return x.astype(np.uint8), False
    if lo < 0 or hi > 1:
        raise RequestError(f"image values span [{lo:g}, {hi:g}]; a float image must be in "
                           f"[0, 1] (or pass a PIL image / uint8 array)")
    return _rescale(x, 255).astype(np.uint8), True


def _size(h: int, w: int, cfg: CLIPImageProcessorConfig) -> tuple[int, int]:
    """Output ``(height, width)`` of the resize (upstream truncates the long edge)."""
    if cfg.resize_to is not None:
        return cfg.resize_to
    s = cfg.shortest_edge
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(s * long / short)
    return (new_long, s) if w <= h else (s, new_long)


def _resize(x: np.ndarray, cfg: CLIPImageProcessorConfig, floats: str) -> np.ndarray:
    """``[H, W, 3]`` → resized ``[h, w, 3]`` through PIL (a float image comes back float32)."""
    u8, scaled = _to_uint8(x, floats)
    h, w = _size(x.shape[0], x.shape[1], cfg)
    out = np.array(PIL.Image.fromarray(u8).resize((w, h), resample=cfg.resample))
    return _rescale(out, 1 / 255) if scaled else out


def _center_crop(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``[C, H, W]`` center crop; an image smaller than ``size`` is zero-padded (centered,
    the extra pixel after) like upstream."""
    h, w = x.shape[-2:]
    ch, cw = size
    top, left = (h - ch) // 2, (w - cw) // 2
    if top >= 0 and left >= 0:
        return x[..., top:top + ch, left:left + cw]
    nh, nw = max(ch, h), max(cw, w)
    canvas = np.zeros(x.shape[:-2] + (nh, nw), x.dtype)
    tp, lp = math.ceil((nh - h) / 2), math.ceil((nw - w) / 2)
    canvas[..., tp:tp + h, lp:lp + w] = x
    top, left = top + tp, left + lp
    return canvas[..., max(0, top):min(nh, top + ch), max(0, left):min(nw, left + cw)]


def preprocess_image(image, cfg: CLIPImageProcessorConfig | None = None,
                     floats: str = "unit") -> np.ndarray:
    """One image → ``[3, crop_h, crop_w]`` float32 pixel values.

    ``image``: a PIL image, a uint8 ``[H, W, 3]`` array, or a float ``[H, W, 3]`` array.
    ``floats`` says what a float array means:

    - ``"unit"`` (default): an image in [0, 1] — the processor's ``rescale_factor`` is not
      applied again (equals ``CLIPImageProcessor(images=x, do_rescale=False)``);
    - ``"diffusers"``: handed over as diffusers' pipeline hands it to the processor, which
      rescales it once more by 1/255 (equals ``CLIPImageProcessor(images=x)``).
    """
    cfg = cfg or CLIPImageProcessorConfig()
    check_choice("floats", floats, FLOAT_MODES)
    if isinstance(image, PIL.Image.Image):
        x = _rgb(image, cfg)
    else:
        x = np.asarray(image)
        if x.ndim != 3 or x.shape[-1] != 3:
            raise RequestError(f"an array image must be [H, W, 3] (RGB, channels last); got "
                               f"shape {x.shape}")
    is_float = np.issubdtype(x.dtype, np.floating)
    if cfg.do_resize:
        x = _resize(x, cfg, floats)
    x = np.moveaxis(x, -1, 0)
    if cfg.do_center_crop:
        x = _center_crop(x, cfg.crop_size)
    if cfg.do_rescale and not (is_float and floats == "unit"):
        x = _rescale(x, cfg.rescale_factor)
    if cfg.do_normalize:
        x = x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float32)
        mean = np.asarray(cfg.image_mean, x.dtype)[:, None, None]
        std = np.asarray(cfg.image_std, x.dtype)[:, None, None]
        x = (x - mean) / std
    return np.ascontiguousarray(x, dtype=np.float32)


def preprocess_images(images, cfg: CLIPImageProcessorConfig | None = None,
                      floats: str = "unit") -> np.ndarray:
    """One image or a list → ``[B, 3, crop_h, crop_w]`` float32 (see
    :func:`preprocess_image`)."""
    one = isinstance(images, PIL.Image.Image) or (
        not isinstance(images, (list, tuple)) and np.ndim(images) == 3)
    out = [preprocess_image(im, cfg, floats) for im in ([images] if one else images)]
    if len({o.shape for o in out}) > 1:
        raise RequestError(f"preprocessed images differ in size {[o.shape for o in out]}; "
                           f"enable do_center_crop or pass images of one size")
    return np.stack(out)
