"""LTX-2 image-to-video's conditioning image: re-compressed as the model saw its training
frames, resized, scaled to [-1, 1] (diffusers' ``LTX2ImageToVideoPipeline``).

LTX-2 (through 2.3) was trained on H.264 video, so its pipeline first passes the image
through one H.264 frame at CRF 33 (``veryfast``, yuv420p; ``crf=0``: not at all), then resizes
it to the request's size (PIL Lanczos) and maps ``[0, 255] → [-1, 1]``. The re-compression
here is ffmpeg's libx264 (the binary imageio-ffmpeg ships) with those settings; diffusers
calls the same encoder through PyAV.
"""

from __future__ import annotations

import subprocess

import numpy as np

from ditax.errors import RequestError

DEFAULT_CRF = 33


def recompress(image: np.ndarray, crf: int) -> np.ndarray:
    """``image`` uint8 ``[H, W, 3]`` through one H.264 frame at ``crf`` (sides cut to even);
    unchanged for ``crf=0``."""
    if crf == 0:
        return image
    import imageio_ffmpeg

    h, w = image.shape[0] // 2 * 2, image.shape[1] // 2 * 2
    image = np.ascontiguousarray(image[:h, :w])
    from ditax.io.ffmpeg import child_env   # the same bytes under any preloaded allocator

    ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
    encoded = subprocess.run(
        [ffmpeg, "-hide_banner", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
         "-s", f"{w}x{h}", "-r", "1", "-i", "pipe:0", "-c:v", "libx264", "-preset", "veryfast",
         "-crf", str(int(crf)), "-pix_fmt", "yuv420p", "-f", "h264", "pipe:1"],
        input=image.tobytes(), capture_output=True, check=False, env=child_env())
    if encoded.returncode:
        raise OSError(f"ffmpeg could not encode the conditioning image: "
                      f"{encoded.stderr.decode(errors='replace').strip()[-200:]}")
    decoded = subprocess.run(
        [ffmpeg, "-hide_banner", "-loglevel", "error", "-f", "h264", "-i", "pipe:0",
         "-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"],
        input=encoded.stdout, capture_output=True, check=False, env=child_env())
    if decoded.returncode or len(decoded.stdout) != h * w * 3:
        raise OSError("ffmpeg could not decode the re-compressed conditioning image")
    return np.frombuffer(decoded.stdout, np.uint8).reshape(h, w, 3).copy()


def check_crf(crf) -> int:
    if isinstance(crf, bool) or not isinstance(crf, (int, np.integer)) or not 0 <= crf <= 51:
        raise RequestError(f"image_crf={crf!r} must be an int in 0..51 (H.264's CRF; 0: no "
                           f"re-compression; LTX-2 trained at {DEFAULT_CRF})")
    return int(crf)


def conditioning_image(image, height: int, width: int, crf: int = DEFAULT_CRF) -> np.ndarray:
    """A PIL image (or uint8 ``[H, W, 3]`` array) → float32 ``[1, 3, 1, height, width]`` in
    [-1, 1], as the pipeline encodes it (module docstring)."""
    import PIL.Image

    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise RequestError(f"image as an array must be uint8 [H, W, 3]; got {image.dtype} "
                               f"{image.shape}")
        rgb = image
    elif isinstance(image, PIL.Image.Image):
        rgb = np.asarray(image.convert("RGB"))
    else:
        raise RequestError(f"image must be a PIL image or a uint8 [H, W, 3] array; got "
                           f"{type(image).__name__}")
    rgb = recompress(rgb, check_crf(crf))
    pil = PIL.Image.fromarray(rgb)
    if pil.size != (width, height):
        pil = pil.resize((width, height), resample=PIL.Image.Resampling.LANCZOS)
    x = np.asarray(pil, np.float32) / np.float32(255.0) * np.float32(2.0) - np.float32(1.0)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None, :, None])


__all__ = ["DEFAULT_CRF", "check_crf", "conditioning_image", "recompress"]
