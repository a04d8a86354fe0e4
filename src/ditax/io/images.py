"""Reading image files a user names (``--image``): opened fully, or one
:class:`~ditax.errors.RequestError` line naming the path and the formats that work."""

from __future__ import annotations

import pathlib

import PIL.Image

from ditax.errors import RequestError


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


__all__ = ["read_image"]


def write_png(path, image) -> pathlib.Path:
    """``image [H, W, 3]`` float in [0, 1] written as an 8-bit PNG (a temporary file beside
    ``path``, renamed at the end: a failed write leaves no half-written file). Used by
    ``ditax generate`` and ``ditax serve`` for image models."""
    import imageio.v2 as imageio

    from ditax.io.outputs import atomic_file
    from ditax.io.video import to_uint8

    path = pathlib.Path(path)
    with atomic_file(path) as tmp:
        imageio.imwrite(str(tmp), to_uint8(image[None])[0], format="png")
    return path
