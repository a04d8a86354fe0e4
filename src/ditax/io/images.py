"""Reading image files a user names (``--image``): opened fully, or one
:class:`~ditax.errors.RequestError` line naming the path and the formats that work; and
condition images on the host: checked and turned into a VAE frame as the pipelines do.

An image is a PIL image or a float array ``[H, W, 3]`` in [0, 1]. :func:`to_frame` gives the
frame the VAE encodes, ``[3, height, width]`` float32 in [-1, 1], with the arithmetic of
diffusers' ``VideoProcessor.preprocess``: a PIL image is resized to (width, height) with PIL's
Lanczos filter, converted to RGB, scaled by 1/255; an array is resized nearest-neighbour with
torch's index rule (source index ``floor(i * in / out)`` in float32); then ``2 x - 1``.
"""

from __future__ import annotations

import pathlib

import numpy as np
import PIL.Image

from ditax.errors import RequestError

#: a mask pixel this close to 0 or 1 is that value (the VACE encoders' rule, and what the
#: preprocess pre-pass checks a mask video against); further off, the mask is not binary
MASK_SNAP = 0.1


def read_image(path, what: str = "--image") -> PIL.Image.Image:
    """Open an image file fully (so a truncated file fails here, not later)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise RequestError(f"{what} {str(path)!r} is not a file; pass a PNG / JPEG / WebP path")
    try:
        with PIL.Image.open(p) as im:
            im.load()
            return im.copy()
    except (OSError, PIL.UnidentifiedImageError, SyntaxError, ValueError) as e:
        raise RequestError(f"{what} {str(path)!r} is not a readable image ({e}); pass a PNG / "
                           f"JPEG / WebP file") from None


def write_png(path, image, stage=None) -> pathlib.Path:
    """``image [H, W, 3]`` float in [0, 1] written as an 8-bit PNG (a temporary file beside
    ``path``, renamed at the end — with the other outputs of ``stage``, a
    :class:`~ditax.io.outputs.Staging`, when given: a failed write leaves no half-written
    file, and is :class:`~ditax.io.outputs.WriteFailed` naming it). Used by ``ditax
    generate`` and ``ditax serve`` for image models."""
    import imageio.v2 as imageio

    from ditax.io.outputs import atomic_file
    from ditax.io.video import to_uint8

    path = pathlib.Path(path)
    with atomic_file(path, stage) as tmp:
        imageio.imwrite(str(tmp), to_uint8(image[None])[0], format="png")
    return path


def check_image(image, name: str = "image"):
    """``image`` if it is a PIL image or a float ``[H, W, 3]`` array in [0, 1] (as float32
    or float64 numpy), else :class:`RequestError` naming what is wrong."""
    if isinstance(image, PIL.Image.Image):
        if image.width < 1 or image.height < 1:
            raise RequestError(f"{name} is an empty PIL image ({image.width}x{image.height})")
        return image
    if isinstance(image, (str, pathlib.Path)):
        raise RequestError(f"{name}={str(image)!r} is a path; pass the image itself "
                           f"(ditax.io.images.read_image(path) or PIL.Image.open)")
    try:
        x = np.asarray(image)
    except Exception:  # noqa: BLE001 - any object numpy cannot take is a bad request
        x = None
    if x is None or x.dtype == object:
        raise RequestError(f"{name} must be a PIL image or a float array [H, W, 3] in [0, 1]; "
                           f"got {type(image).__name__}")
    if x.ndim != 3 or x.shape[-1] != 3 or 0 in x.shape:
        raise RequestError(f"{name} must be [H, W, 3] (RGB, channels last); got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise RequestError(f"{name} has dtype {x.dtype}; pass floats in [0, 1] (e.g. "
                           f"pixels / 255) or a PIL image")
    if not np.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise RequestError(f"{name} values span [{x.min():g}, {x.max():g}]; a float image must "
                           f"be in [0, 1]")
    return x


def nearest_indices(n_in: int, n_out: int) -> np.ndarray:
    """Source rows of a nearest-neighbour resize ``n_in → n_out`` (torch's rule)."""
    if n_in == n_out:
        return np.arange(n_out)
    scale = np.float32(n_in) / np.float32(n_out)
    idx = np.floor(np.arange(n_out, dtype=np.float32) * scale).astype(np.int64)
    return np.minimum(idx, n_in - 1)


def to_frame(image, height: int, width: int, name: str = "image") -> np.ndarray:
    """``[3, height, width]`` float32 in [-1, 1]: the frame the VAE encodes (module docstring)."""
    image = check_image(image, name)
    if isinstance(image, PIL.Image.Image):
        image = image.resize((width, height), resample=PIL.Image.LANCZOS, reducing_gap=None)
        x = np.asarray(image.convert("RGB")).astype(np.float32) / 255.0
    else:
        x = image[nearest_indices(image.shape[0], height)][:, nearest_indices(image.shape[1],
                                                                              width)]
    x = 2.0 * x - 1.0
    return np.ascontiguousarray(np.transpose(x, (2, 0, 1)), np.float32)


__all__ = ["check_image", "nearest_indices", "read_image", "to_frame", "write_png"]
