"""Wan 2.1 image-to-video conditioning: the image embedder (diffusers ``WanImageEmbedding``).

CLIP image features ``[B, S, Di]`` (S = 257 tokens per image, Di = ``image_dim``) become
cross-attention tokens ``[B, S, D]``: float32 LayerNorm → GELU MLP (``Di → Di → D``) → float32
LayerNorm. First-last-frame models (``pos_embed_seq_len`` set) take two images per sample,
``[2B, S, Di]`` with each sample's (first, last) pair adjacent (diffusers' layout) or already
``[B, 2S, Di]``, and add a learned position table ``[1, 2S, Di]`` before the first norm.

The image tokens then meet the video in each block's cross-attention through the added K/V
projections (:class:`ditax.models.wan.transformer.WanAttention`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.nn import FP32LayerNorm, Linear

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which WanImageEmbedding keeps


class ImageEmbedder(nnx.Module):
    """``[B, S, Di] → [B, S, D]`` (FLF2V: ``[2B, S, Di] → [B, 2S, D]``)."""

    def __init__(self, image_dim: int, dim: int, pos_embed_seq_len: int | None = None, *,
                 dtype, param_dtype, rngs):
        pd = jnp.dtype(param_dtype)
        kw = dict(dtype=dtype, param_dtype=pd, rngs=rngs)
        self.norm1 = FP32LayerNorm(image_dim, LAYER_NORM_EPS, affine=True, param_dtype=pd)
        self.proj_in = Linear(image_dim, image_dim, **kw)   # diffusers: ff.net.0.proj
        self.proj_out = Linear(image_dim, dim, **kw)        # diffusers: ff.net.2
        self.norm2 = FP32LayerNorm(dim, LAYER_NORM_EPS, affine=True, param_dtype=pd)
        if pos_embed_seq_len is not None:
            self.pos_embed = nnx.Param(jnp.zeros((1, pos_embed_seq_len, image_dim), pd))
        else:
            self.pos_embed = None

    def __call__(self, image):
        dt = image.dtype
        if self.pos_embed is not None:
            table = self.pos_embed[...]
            image = image.reshape(-1, table.shape[1], image.shape[-1]) + table.astype(dt)
        h = self.norm1(image).astype(dt)
        h = jax.nn.gelu(self.proj_in(h), approximate=False)
        return self.norm2(self.proj_out(h)).astype(dt)


def check_image(cfg, batch: int, image) -> None:
    """Raise ValueError when the image features do not fit the model (``cfg`` a
    :class:`~ditax.models.wan.config.ModelConfig`, ``batch`` the latents' batch size)."""
    if cfg.image_dim is None:
        if image is not None:
            raise ValueError("encoder_hidden_states_image was given but this is a text-to-video "
                             "transformer (no image_dim); pass None or load an I2V model")
        return
    if image is None:
        raise ValueError(f"this image-to-video transformer (image_dim={cfg.image_dim}) needs "
                         f"encoder_hidden_states_image [B, S, {cfg.image_dim}] (CLIP features)")
    shape = tuple(image.shape)
    if len(shape) != 3 or shape[-1] != cfg.image_dim:
        raise ValueError(f"encoder_hidden_states_image must be [B, S, image_dim={cfg.image_dim}]; "
                         f"got {shape}")
    n = cfg.pos_embed_seq_len
    if n is None:
        if shape[0] != batch:
            raise ValueError(f"encoder_hidden_states_image has batch {shape[0]}; the latents "
                             f"have {batch}")
    elif shape[1] not in (n, n // 2) or shape[0] * shape[1] != batch * n:
        raise ValueError(f"first-last-frame model (pos_embed_seq_len={n}): "
                         f"encoder_hidden_states_image must be [2B={2 * batch}, {n // 2}, "
                         f"{cfg.image_dim}] (first/last pairs) or [B={batch}, {n}, "
                         f"{cfg.image_dim}]; got {shape}")
