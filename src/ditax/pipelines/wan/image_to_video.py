"""Wan image-to-video pipelines: prompt + image(s) → video ``[F, H, W, 3]`` in [0, 1].

:class:`WanImageToVideo` is the text-to-video pipeline (same loop, same compiled step, same
decode; :mod:`.text_to_video`) plus the image condition it builds once per request
(:mod:`.conditioning` holds what the step does with it):

- **Wan 2.1 I2V / FLF2V and Wan 2.2 I2V A14B** (``WanImageToVideoPipeline`` folders): the
  condition video is the image as frame 0, zeros after it (and ``last_image`` as the last frame
  for first-last-frame), VAE-encoded (posterior mean) and normalised with ``latents_mean`` /
  ``latents_std``; the mask is 1 on the given frames, its first frame repeated ``tf`` times
  (the VAE's temporal factor) and folded into ``tf`` channels per latent frame. The transformer
  reads ``[noise, mask, condition]`` (``in_channels = 2 z + tf``). Wan 2.1 also conditions
  cross-attention on the CLIP features of the image(s) (penultimate layer, ``image_encoder``
  and ``image_processor`` from the folder); Wan 2.2 A14B has no image encoder.
- **Wan 2.2 TI2V-5B** (``expand_timesteps``, either class): the image alone is encoded and
  replaces the first latent frame before every forward; that frame's tokens run at t=0, the
  others at t; the final latents get the same replacement. Without an image the folder is a
  text-to-video model (every token at t).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ditax.errors import RequestError
from ditax.pipelines.wan.conditioning import Condition
from ditax.io.images import to_frame
from ditax.pipelines.wan.text_to_video import WanTextToVideo


class WanImageToVideo(WanTextToVideo):
    """A loaded Wan image-to-video (or TI2V) pipeline; call it with a prompt and ``image=``.
    See :func:`~ditax.pipelines.wan.loading.load_pipeline` and the module docstring."""

    def __init__(self, *, image_encoder=None, image_processor=None,
                 expand_timesteps: bool = False, **kw):
        super().__init__(**kw)
        self.image_encoder = image_encoder
        self.image_processor = image_processor
        self.expand_timesteps = bool(expand_timesteps)

    @property
    def kind(self) -> str:
        """``"ti2v"`` (image optional) or ``"i2v"`` (image required)."""
        return "ti2v" if self.expand_timesteps else "i2v"

    # --- the request's condition
    def _check_images(self, image, last_image) -> None:
        if image is None:
            if last_image is not None:
                raise RequestError("last_image= needs image= (the first frame) too")
            if not self.expand_timesteps:
                raise RequestError("this is an image-to-video folder (WanImageToVideoPipeline); "
                                   "pass the first frame: image= (CLI: --image first.png)")
        if last_image is None:
            return
        if self.expand_timesteps:
            raise RequestError("last_image= is not supported by Wan 2.2 TI2V (expand_timesteps "
                               "conditions the first frame only); drop it")
        tc = self.transformer.config
        if tc.image_dim is not None and tc.pos_embed_seq_len is None:
            raise RequestError("last_image= needs a first-last-frame model (Wan2.1-FLF2V: its "
                               "image embedder has pos_embed); this Wan 2.1 I2V model "
                               "conditions on the first frame only — drop last_image")

    def condition(self, image, last_image, height: int, width: int, num_frames: int):
        """The :class:`~ditax.pipelines.wan.conditioning.Condition` of this request (None for a
        TI2V request without an image)."""
        from ditax.models.wan.conditioning import (channel_condition, clip_features,
                                                   encode_normalized, first_frame_masks)

        self._check_images(image, last_image)
        if image is None:
            return None
        if last_image is not None and num_frames < 2:
            raise RequestError(f"last_image= needs a video of more than one frame; "
                               f"num_frames={num_frames} — use 5 or more")
        first = to_frame(image, height, width, "image")
        tc = self.transformer.config
        if self.expand_timesteps:
            grid = self.vae.config.latent_grid(num_frames, height, width)
            frame, tokens = first_frame_masks(grid, tc.patch_size)          # [F], [L]
            frame_mask = np.ascontiguousarray(np.broadcast_to(              # [1, 1, F, Y, X]
                frame[None, None, :, None, None], (1, 1, *grid)))
            return Condition(frame_mask=jnp.asarray(frame_mask),
                             latent=encode_normalized(self.vae, first[None, :, None]),
                             token_mask=jnp.asarray(tokens[None]))
        last = None if last_image is None else to_frame(last_image, height, width, "last_image")
        channels = channel_condition(self.vae, first, last, num_frames)
        image_embeds = None
        if tc.image_dim is not None:
            images = [image] if last_image is None else [image, last_image]
            image_embeds = clip_features(self.image_encoder, self.image_processor, images)
            image_embeds = image_embeds.astype(self.dtype)
        return Condition(channels=channels, image=image_embeds)


__all__ = ["WanImageToVideo"]
