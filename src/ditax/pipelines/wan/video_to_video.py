"""Wan video-to-video: prompt + source video → video ``[F, H, W, 3]`` in [0, 1].

The behaviour of diffusers' ``WanVideoToVideoPipeline`` on a text-to-video folder's components:

1. the source frames (float ``[F, H, W, 3]`` in [0, 1] or PIL images, ``F = 4k + 1``) become
   VAE frames in [-1, 1] as ``VideoProcessor.preprocess_video`` makes them (each resized to
   ``height x width``: :func:`~ditax.io.images.to_frame`), then the normalised
   posterior mean ``z`` ``[1, C, F', Y, X]``;
2. of the scheduler's ``N`` steps the first ``N - int(N * strength)`` are cut (the scheduler's
   ``from_step``; ``strength`` in (0, 1], 1 = the whole schedule);
3. the start is the source noised to the first kept step, ``(1 - s) z + s noise`` (``noise``
   from ``seed``), or the given ``latents`` (that noised start already, as diffusers);
4. the rest is the text-to-video loop (:func:`~ditax.pipelines.sampling.sample`: CFG, Wan 2.2's
   two experts, step caching, the compiled step) and decode.

Build it from a loaded text-to-video pipeline with :meth:`WanVideoToVideo.from_pipeline` (the
components are shared, nothing loads again) or ``load_pipeline(folder, video_to_video=True)``.
"""

from __future__ import annotations

import contextlib
import numbers

import numpy as np
import PIL.Image

from ditax.errors import RequestError
from ditax.io.images import to_frame
from ditax.pipelines.wan.text_to_video import WanTextToVideo


def start_step(num_inference_steps: int, strength: float) -> int:
    """How many of the schedule's first steps a ``strength`` cuts (diffusers' rule:
    ``N - min(int(N * strength), N)``); a strength that keeps no step is a
    :class:`RequestError`."""
    if (isinstance(strength, bool) or not isinstance(strength, numbers.Real)
            or not 0.0 < float(strength) <= 1.0):
        raise RequestError(f"strength={strength!r} must be a number in (0, 1] (1 = start from "
                           f"pure noise, lower keeps more of the source video; e.g. 0.8)")
    kept = min(int(num_inference_steps * float(strength)), num_inference_steps)
    if kept < 1:
        raise RequestError(f"strength={strength} with {num_inference_steps} steps keeps "
                           f"int({num_inference_steps} * {strength}) = 0 steps; raise the "
                           f"strength or the steps (at least {num_inference_steps} * "
                           f"strength >= 1)")
    return num_inference_steps - kept


def video_frames(video) -> list:
    """The source frames as a list (PIL images or float ``[H, W, 3]`` arrays); a video that is
    not one is a :class:`RequestError`."""
    if isinstance(video, (list, tuple)):
        frames = list(video)
    else:
        x = np.asarray(video) if not isinstance(video, PIL.Image.Image) else None
        if x is None or x.ndim != 4:
            raise RequestError(f"video must be a float array [F, H, W, 3] in [0, 1] or a list "
                               f"of frames (PIL images); got "
                               f"{getattr(x, 'shape', type(video).__name__)}")
        frames = list(x)
    if not frames:
        raise RequestError("video has no frames; pass 4k+1 frames (e.g. 5, 9, 81)")
    return frames


def frame_size(frame) -> tuple[int, int]:
    """``(height, width)`` of a PIL image or an ``[H, W, 3]`` array."""
    if isinstance(frame, PIL.Image.Image):
        return frame.height, frame.width
    return tuple(np.shape(frame)[:2])


class WanVideoToVideo(WanTextToVideo):
    """A Wan text-to-video pipeline that starts from a source video (module docstring)."""

    _request = None   # (frames [1, 3, F, H, W], start step) of the call in progress
    batches = False   # prepare() holds only inside the call (its source): one by one

    @classmethod
    def from_pipeline(cls, pipe: WanTextToVideo) -> "WanVideoToVideo":
        """The video-to-video pipeline on ``pipe``'s components and compiled programs (shared,
        not copied); ``pipe`` must be a text-to-video pipeline."""
        if type(pipe) is not WanTextToVideo:
            raise RequestError(f"video-to-video runs on a text-to-video pipeline (WanPipeline "
                               f"folders); this is a {type(pipe).__name__} — load a Wan "
                               f"T2V folder")
        out = cls.__new__(cls)
        out.__dict__.update(pipe.__dict__)
        return out

    def condition(self, image, last_image, height, width, num_frames):
        if image is not None or last_image is not None:
            raise RequestError("video-to-video takes no image= / last_image=; drop them (the "
                               "source is video=)")
        return None

    def sample_options(self, num_inference_steps: int) -> dict:
        frames, start = self._request
        if frames is None:
            return {"start_step": start}
        from ditax.models.wan.conditioning import encode_normalized

        return {"start_step": start, "source": lambda: encode_normalized(self.vae, frames)}

    def __call__(self, prompt, video=None, strength: float = 0.8, *, height: int | None = None,
                 width: int | None = None, num_frames: int | None = None,
                 num_inference_steps: int | None = None, latents=None, **kw):
        """Generate one video from ``video`` (float ``[F, H, W, 3]`` in [0, 1] or a list of
        frames, ``F = 4k + 1``) at ``strength`` (in (0, 1]; diffusers' default 0.8). Sizes
        default to the video's (frames are resized to ``height x width`` when given);
        ``num_frames`` is the video's. ``latents`` instead of ``video``: the noised start
        ``[1, C, F', Y, X]`` (as diffusers). Every other argument is the text-to-video
        call's (:meth:`WanTextToVideo.__call__`)."""
        steps = self.call_defaults(num_inference_steps=num_inference_steps)[
            "num_inference_steps"]
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise RequestError(f"num_inference_steps={steps!r} must be a positive int")
        start = start_step(steps, strength)
        if (video is None) == (latents is None):
            raise RequestError("video-to-video needs the source video=, or latents= (the noised "
                               "start) instead — exactly one of them")
        frames = None
        if video is not None:
            frames, height, width, num_frames = self._frames(video, height, width, num_frames)
        with self._serving((frames, start)):
            return super().__call__(prompt, height=height, width=width, num_frames=num_frames,
                                    num_inference_steps=steps, latents=latents, **kw)

    @contextlib.contextmanager
    def _serving(self, request):
        self._request = request
        try:
            yield
        finally:
            self._request = None

    def _frames(self, video, height, width, num_frames):
        """``(frames [1, 3, F, H, W] in [-1, 1], height, width, F)``: the source checked against
        the request (module docstring), sizes defaulting to the video's."""
        frames = video_frames(video)
        sizes = {frame_size(f) for f in frames}
        if len(sizes) > 1:
            raise RequestError(f"video frames differ in size ({sorted(sizes)}); give frames of "
                               f"one size")
        (h, w), = sizes
        n, tf = len(frames), self.vae.scale_factor_temporal
        if (n - 1) % tf:
            fit = ((n - 1) // tf) * tf + 1
            raise RequestError(f"video has {n} frames; video-to-video needs {tf}k+1 frames "
                               f"(the VAE's temporal factor {tf}) — use its first {fit}")
        if num_frames is not None and num_frames != n:
            raise RequestError(f"num_frames={num_frames} but the video has {n} frames; drop "
                               f"num_frames (it is the video's) or trim the video to it")
        sf = self.vae.scale_factor_spatial * self.transformer.config.patch_size[1]
        if (height is None and h % sf) or (width is None and w % sf):
            raise RequestError(f"the video is {w}x{h}; its height and width must be multiples "
                               f"of {sf} — resize it, or pass height= / width= (CLI: --height "
                               f"/ --width) to resize its frames")
        height, width = h if height is None else height, w if width is None else width
        out = np.stack([to_frame(f, height, width, f"video frame {i}")
                        for i, f in enumerate(frames)], axis=1)            # [3, F, H, W]
        return out[None], height, width, n


__all__ = ["WanVideoToVideo", "start_step"]
