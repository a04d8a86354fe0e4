"""The encoders ``ditax preprocess`` runs for FLUX.2: a ``Flux2Pipeline`` (dev: Mistral-3) or
``Flux2KleinPipeline`` (klein: Qwen3) folder's VAE and text encoder, as diffusers' training
scripts (``train_dreambooth_lora_flux2*.py``) prepare a sample:

- image ``[B, 3, 1, H, W]`` in [-1, 1] → the VAE's posterior mode (its mean) ``[B, 32, H/8,
  W/8]``, patchified 2 x 2 and normalised by the VAE's latent BatchNorm statistics →
  ``[B, 128, 1, H/16, W/16]``, the latents :func:`ditax.models.flux2.training.denoise` reads;
- caption → the pipeline's prompt embeddings ``[B, T, 3·D_text]`` (the chat template, the
  kind's hidden-state layers stacked: :mod:`ditax.models.encoders.decoder_lm`), and the token
  mask (the pipelines attend to every token, so the mask is stored, not used).
"""

from __future__ import annotations

import pathlib

import jax.numpy as jnp

from ditax.errors import ConfigError, RequestError
from ditax.models.base import Encoders, TextEncoding

DEV_CLASS = "Flux2Pipeline"        # model_index.json _class_name of a dev folder (Mistral-3)


class Flux2Encoders(Encoders):
    """A FLUX.2 pipeline folder's ``vae/``, ``text_encoder/`` and ``tokenizer/``."""

    def __init__(self, folder, dtype: str = "float32"):
        from ditax.io.files import read_model_json
        from ditax.models.encoders import decoder_lm as lm
        from ditax.models.vae.flux2 import load_flux2_vae

        folder = pathlib.Path(folder)
        index = folder / "model_index.json"
        if not index.is_file():
            raise ConfigError(f"{folder}: no model_index.json; ditax preprocess for FLUX.2 "
                              f"needs a Flux2Pipeline or Flux2KleinPipeline folder")
        dev = read_model_json(index, "model_index.json").get("_class_name") == DEV_CLASS
        self.dtype = dtype
        self.vae = load_flux2_vae(folder, dtype)
        if dev:
            self.text = lm.load_mistral3_text(folder, dtype=dtype)
            self.tokenizer = lm.load_mistral_tokenizer(folder)
            self._embed, self._ids = lm.mistral3_prompt_embeds, lm.mistral3_prompt_ids
        else:
            self.text = lm.load_qwen3(folder, dtype=dtype)
            self.tokenizer = lm.load_qwen3_tokenizer(folder)
            self._embed, self._ids = lm.qwen3_prompt_embeds, lm.qwen3_prompt_ids

    def encode_video(self, video):
        """``[B, 3, 1, H, W]`` in [-1, 1] → patchified, normalised latents ``[B, 4C, 1, H/16,
        W/16]`` float32 (a still image is one frame)."""
        video = jnp.asarray(video)
        grid = self.vae.config.spatial_factor * 2
        if video.ndim != 5 or video.shape[2] != 1:
            raise RequestError(f"FLUX.2 encodes still images [B, 3, 1, H, W]; got shape "
                               f"{tuple(video.shape)} (use --frames 1)")
        if video.shape[3] % grid or video.shape[4] % grid:
            raise RequestError(f"image size {video.shape[3]}x{video.shape[4]}: FLUX.2 needs "
                               f"multiples of {grid} (the VAE's {grid // 2}x and the 2x2 "
                               f"patchify)")
        z = self.vae.encode(video[:, :, 0].astype(self.dtype))
        z = self.vae.normalize_latents(self.vae.patchify_latents(jnp.asarray(z, jnp.float32)))
        return z[:, :, None]

    def encode_text(self, captions, text_len: int) -> TextEncoding:
        """The pipeline's prompt embeddings ``[B, text_len, 3·D_text]`` and token mask."""
        captions = list(captions)
        _, mask = self._ids(self.tokenizer, captions, text_len)
        emb = self._embed(self.text, self.tokenizer, captions, text_len)
        return TextEncoding(jnp.asarray(emb, jnp.float32), mask, {})


__all__ = ["Flux2Encoders"]
