"""FLUX.2's reference images (image-conditioned generation): checked, sized and scaled as
diffusers' ``Flux2Pipeline`` / ``Flux2KleinPipeline`` (with their ``Flux2ImageProcessor``)
prepare each ``image=`` before the VAE encodes it.

Per image (a PIL image, or a uint8 ``[H, W, 3]`` array taken as one):

1. refused unless both sides are at least 64 pixels and the aspect ratio is at most 8:1;
2. an image of more than 1024 x 1024 pixels is resized (PIL Lanczos) to about that area,
   keeping its aspect: ``side * sqrt(1024^2 / area)`` truncated to an int;
3. each side cut down to a multiple of the grid (the VAE's factor x the 2x2 patch: 16 for
   FLUX.2) by a centre crop — no resampling;
4. RGB, ``[0, 255] → [-1, 1]``, channels first.

The generated image's size defaults to the first reference's size after step 3 where the
call gives none (diffusers' rule).
"""

from __future__ import annotations

import math

import numpy as np

from ditax.errors import RequestError

MIN_SIDE = 64
MAX_ASPECT = 8
MAX_AREA = 1024 * 1024


def as_pil(image, name: str):
    """``image`` as a PIL image: a PIL image, or a uint8 ``[H, W, 3]`` array; else one
    :class:`RequestError` line naming ``name``."""
    import PIL.Image

    if isinstance(image, PIL.Image.Image):
        return image
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise RequestError(f"{name} as an array must be uint8 [H, W, 3]; got {image.dtype} "
                               f"{image.shape} (pass a PIL image, or pixels as uint8)")
        return PIL.Image.fromarray(image)
    what = "a path" if isinstance(image, str) else type(image).__name__
    raise RequestError(f"{name} must be a PIL image or a uint8 [H, W, 3] array; got {what} "
                       f"(open a file with PIL.Image.open or ditax.io.images.read_image)")


def check_reference(image, name: str) -> None:
    """The size rules of step 1 (module docstring) for PIL image ``image``."""
    w, h = image.size
    if w < MIN_SIDE or h < MIN_SIDE:
        raise RequestError(f"{name} is {w}x{h}; a reference image needs both sides >= "
                           f"{MIN_SIDE} pixels (upscale it first)")
    if max(w / h, h / w) > MAX_ASPECT:
        raise RequestError(f"{name} is {w}x{h} (aspect {max(w / h, h / w):.1f}:1); a reference "
                           f"image may be at most {MAX_ASPECT}:1 — crop it")


def reference_size(image, grid: int) -> tuple[int, int]:
    """``(height, width)`` the PIL ``image`` is used at (steps 2-3): its size after the area
    cap, each side cut down to a multiple of ``grid``."""
    w, h = image.size
    if w * h > MAX_AREA:
        s = math.sqrt(MAX_AREA / (w * h))
        w, h = int(w * s), int(h * s)
    return h // grid * grid, w // grid * grid


def prepare_reference(image, grid: int, name: str = "image") -> np.ndarray:
    """One reference image → float32 ``[1, 3, H, W]`` in [-1, 1] as the VAE encodes it
    (module docstring; ``grid``: the VAE's factor x 2)."""
    import PIL.Image

    image = as_pil(image, name)
    check_reference(image, name)
    w, h = image.size
    if w * h > MAX_AREA:
        s = math.sqrt(MAX_AREA / (w * h))
        image = image.resize((int(w * s), int(h * s)), PIL.Image.Resampling.LANCZOS)
        w, h = image.size
    height, width = h // grid * grid, w // grid * grid
    left, top = (w - width) // 2, (h - height) // 2
    image = image.crop((left, top, left + width, top + height)).convert("RGB")
    x = np.asarray(image).astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray((np.float32(2.0) * x - np.float32(1.0)).transpose(2, 0, 1)[None])


def reference_list(image) -> list:
    """The call's ``image=`` as a list: None → ``[]``, one image → ``[image]``, a list or
    tuple as it is."""
    if image is None:
        return []
    return list(image) if isinstance(image, (list, tuple)) else [image]


def check_references(images, grid: int) -> list[tuple[int, int]]:
    """Each reference's ``(height, width)`` after preparation, checked (one
    :class:`RequestError` naming ``image[i]``) before any model work."""
    sizes = []
    for i, image in enumerate(images):
        name = "image" if len(images) == 1 else f"image[{i}]"
        pil = as_pil(image, name)
        check_reference(pil, name)
        sizes.append(reference_size(pil, grid))
    return sizes


__all__ = ["MAX_AREA", "MAX_ASPECT", "MIN_SIDE", "as_pil", "check_reference",
           "check_references", "prepare_reference", "reference_list", "reference_size"]
