"""Wan 2.2 Animate transformer (diffusers ``WanAnimateTransformer3DModel``): the Wan image-to-
video DiT plus a pose path and a face path.

Inputs: latents ``[B, 2z + 4, F, Y, X]`` (noise, mask and the reference / condition latents as
Wan I2V; latent frame 0 is the reference image), pose latents ``[B, z, F - 1, Y, X]``, face
crops ``[B, 3, S, P, P]`` in [-1, 1] (``P = motion_encoder_size``, ``S`` face frames with
``T'(S) + 1 = F``, see :func:`~ditax.models.wan.animate_encoders.face_frames_out`), text and
CLIP features as Wan 2.1 I2V.

- pose: ``pose_patch_embedding`` (a Conv3d like ``patch_embedding``) of the pose latents is
  added to the tokens of latent frames 1..F-1;
- face: each crop → the motion encoder → per-frame vectors → the face encoder ``[B, F - 1,
  n + 1, D]``, a zero frame in front (frame 0, the reference) → ``[B, F, n + 1, D]``; it rides
  in :attr:`~ditax.models.wan.transformer.Embedded.hints` to the blocks;
- blocks: Wan's blocks (scanned, every attention backend and mesh), and after block
  ``k * inject_face_latents_blocks`` the face adapter ``k``'s update is added
  (:class:`~ditax.models.wan.animate_encoders.FaceAdapter`, frame-local: it runs on the
  unpadded tokens and is added back).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.errors import ConfigError
from ditax.models.wan.animate_encoders import (FaceAdapter, FaceEncoder, MotionEncoder,
                                               face_frames_out)
from ditax.models.wan.config import WanConfig
from ditax.models.wan.extra_inputs import checked_embed
from ditax.models.wan.transformer import WanTransformer, patch_embedding
from ditax.nn.stack import make_stack

ANIMATE_CLASS = "WanAnimateTransformer3DModel"
#: diffusers' default motion encoder widths per feature size
MOTION_CHANNELS = {"4": 512, "8": 512, "16": 512, "32": 512, "64": 256, "128": 128, "256": 64,
                   "512": 32, "1024": 16}
ANIMATE_FIELDS = ("motion_encoder_channel_sizes", "motion_encoder_size", "motion_style_dim",
                  "motion_dim", "motion_encoder_dim", "face_encoder_hidden_dim",
                  "face_encoder_num_heads", "inject_face_latents_blocks",
                  "motion_encoder_batch_size", "latent_channels")


@dataclass(frozen=True)
class WanAnimateConfig(WanConfig):
    """:class:`WanConfig` plus the Animate fields (diffusers' names and defaults)."""

    # the pose tokens and face adapters index frame-major tokens: no attention.sparsity yet
    SPARSE_ATTENTION = False

    in_channels: int = 36
    image_dim: int | None = 1280
    latent_channels: int = 16
    motion_encoder_channel_sizes: tuple = ()       # (("16", 512), ...); () = diffusers' table
    motion_encoder_size: int = 512
    motion_style_dim: int = 512
    motion_dim: int = 20
    motion_encoder_dim: int = 512
    face_encoder_hidden_dim: int = 1024
    face_encoder_num_heads: int = 4
    inject_face_latents_blocks: int = 5
    motion_encoder_batch_size: int = 8
    motion_blocks: int = field(default=5)          # linears of the motion network (fixed)

    @classmethod
    def from_diffusers(cls, cfg: dict, **overrides) -> "WanAnimateConfig":
        cfg = dict(cfg)
        sizes = cfg.get("motion_encoder_channel_sizes")
        cfg["motion_encoder_channel_sizes"] = tuple(sorted((sizes or {}).items()))
        if cfg.get("latent_channels") is None:
            cfg["latent_channels"] = (cfg.get("in_channels", 36) - 4) // 2
        if cfg.get("out_channels") is None:
            cfg["out_channels"] = cfg["latent_channels"]
        return super().from_diffusers(cfg, **overrides)

    def to_diffusers(self) -> dict:
        out = super().to_diffusers()
        out["_class_name"] = ANIMATE_CLASS
        for f in ANIMATE_FIELDS:
            out[f] = getattr(self, f)
        out["motion_encoder_channel_sizes"] = dict(self.motion_encoder_channel_sizes) or None
        return out

    @property
    def motion_channels(self) -> dict:
        """Motion encoder width per feature size (str → int)."""
        return dict(self.motion_encoder_channel_sizes) or dict(MOTION_CHANNELS)

    @property
    def num_face_adapters(self) -> int:
        return self.num_layers // self.inject_face_latents_blocks


def check_animate(m: WanAnimateConfig) -> None:
    """The Animate fields' rules (after :func:`~ditax.models.wan.config.check_transformer`)."""
    if m.in_channels != 2 * m.latent_channels + 4:
        raise ConfigError(f"model.in_channels={m.in_channels} must be 2 * latent_channels + 4 = "
                          f"{2 * m.latent_channels + 4} (noise, mask, condition latents)")
    if m.patch_size[0] != 1:
        raise ConfigError(f"model.patch_size={m.patch_size}: Wan Animate adds pose tokens per "
                          f"latent frame; patch_size[0] must be 1")
    inj = m.inject_face_latents_blocks
    if inj < 1 or m.num_layers % inj:
        raise ConfigError(f"model.inject_face_latents_blocks={inj} must divide num_layers="
                          f"{m.num_layers} (one face adapter per {inj} blocks)")
    size = m.motion_encoder_size
    need = [size // 2 ** j for j in range(int(size).bit_length() - 2)]
    if size < 8 or size & (size - 1) or any(str(s) not in m.motion_channels for s in need):
        raise ConfigError(f"model.motion_encoder_size={size} must be a power of two >= 8 with "
                          f"a motion_encoder_channel_sizes entry for each of {need}")
    if m.image_dim is None:
        raise ConfigError("model.image_dim=None: Wan Animate conditions on the CLIP features "
                          "of the reference image; set image_dim (1280)")
    if m.quantize != "none":
        raise ConfigError(f"model.quantize={m.quantize!r} is not wired for Wan Animate (its "
                          f"face path would stay unquantized); use model.quantize=none")


class WanAnimateTransformer(WanTransformer):
    """``model(latents, t, text, image, pose_hidden_states=[B, z, F-1, Y, X],
    face_pixel_values=[B, 3, S, P, P]) → [B, z, F, Y, X]`` (module docstring)."""

    TOKEN_COPIES = False   # its adapters change the tokens after embed: no copies

    def __init__(self, cfg: WanAnimateConfig, attention=None, mesh=None, *, rngs: nnx.Rngs):
        super().__init__(cfg, attention, mesh, rngs=rngs)
        pd = jnp.dtype(cfg.param_dtype)
        kw = dict(dtype=cfg.dtype, param_dtype=pd, rngs=rngs)
        self.pose_patch_embedding_kernel, self.pose_patch_embedding_bias = patch_embedding(
            cfg, cfg.latent_channels, rngs)
        self.motion_encoder = MotionEncoder(cfg, param_dtype=pd, rngs=rngs)
        self.face_encoder = FaceEncoder(cfg, **kw)
        self.face_adapter = make_stack(lambda r: FaceAdapter(cfg, dtype=cfg.dtype,
                                                             param_dtype=pd, rngs=r),
                                       cfg.num_face_adapters, rngs)

    def check_animate_inputs(self, latents, pose, face) -> None:
        """Raise ValueError naming the shapes of pose / face inputs the model cannot take."""
        cfg = self.cfg
        b, _, f, y, x = latents.shape
        z, p = cfg.latent_channels, cfg.motion_encoder_size
        if pose is None or tuple(pose.shape) != (b, z, f - 1, y, x):
            raise ValueError(f"pose_hidden_states must be [B={b}, {z}, F-1={f - 1}, {y}, {x}] "
                             f"(the pose video's latents, one frame fewer than the latents); "
                             f"got {None if pose is None else tuple(pose.shape)}")
        if face is None or face.ndim != 5 or face.shape[0] != b or face.shape[1] != 3 or tuple(
                face.shape[3:]) != (p, p):
            raise ValueError(f"face_pixel_values must be [B={b}, 3, S, {p}, {p}] (face crops at "
                             f"motion_encoder_size); got "
                             f"{None if face is None else tuple(face.shape)}")
        if face_frames_out(face.shape[2]) + 1 != f:
            raise ValueError(f"face_pixel_values has {face.shape[2]} frames, which the face "
                             f"encoder turns into {face_frames_out(face.shape[2])}; the latents' "
                             f"{f} frames need {f - 1} (e.g. {4 * (f - 2) + 1} face frames)")

    def __call__(self, latents, timestep, encoder_hidden_states, text_mask=None,
                 encoder_hidden_states_image=None, pose_hidden_states=None,
                 face_pixel_values=None):
        h, ctx = self.embed(latents, timestep, encoder_hidden_states, text_mask,
                            encoder_hidden_states_image, pose_hidden_states, face_pixel_values)
        return self.head(self.run_blocks(h, ctx), ctx)

    def embed(self, latents, timestep, encoder_hidden_states, text_mask=None,
              encoder_hidden_states_image=None, pose_hidden_states=None,
              face_pixel_values=None):
        """Wan's embedding plus the pose tokens; the face tokens ``[B, F, n + 1, D]`` as
        ``ctx.hints``."""
        h, ctx, (pose, face) = checked_embed(
            super().embed, self.check_animate_inputs, (pose_hidden_states, face_pixel_values),
            latents, timestep, encoder_hidden_states, text_mask, encoder_hidden_states_image)
        cfg, sharding = self.cfg, self.sharding
        dt = jnp.dtype(cfg.dtype)
        b, z, fp, yy, xx = pose.shape
        _, ph, pw = cfg.patch_size
        y, x = yy // ph, xx // pw
        xp = pose.astype(dt).reshape(b, z, fp, 1, y, ph, x, pw)
        xp = xp.transpose(0, 2, 4, 6, 3, 5, 7, 1).reshape(b, fp * y * x, ph * pw * z)
        kern = self.pose_patch_embedding_kernel[...].astype(dt).reshape(ph * pw * z, -1)
        tok = jnp.einsum("blc,cd->bld", xp, kern) + self.pose_patch_embedding_bias[...].astype(dt)
        h = h + jnp.pad(tok, ((0, 0), (y * x, ctx.pad), (0, 0)))        # frames 1.. only
        h = sharding.constrain(h, ("act_batch", "act_seq", "act_embed"))
        return h, ctx._replace(hints=self.face_tokens(face.astype(dt)))

    def face_tokens(self, face):
        """Face crops ``[B, 3, S, P, P]`` → ``[B, T' + 1, n + 1, D]`` (a zero frame first)."""
        b, c, s, p, _ = face.shape
        crops = face.transpose(0, 2, 3, 4, 1).reshape(b * s, p, p, c)
        bs = self.cfg.motion_encoder_batch_size
        n = -(-crops.shape[0] // bs)
        padded = jnp.pad(crops, ((0, n * bs - crops.shape[0]), (0, 0), (0, 0), (0, 0)))
        # in batches of motion_encoder_batch_size crops (the reference's memory bound)
        vec = jax.lax.map(self.motion_encoder, padded.reshape(n, bs, p, p, c))
        vec = vec.reshape(n * bs, -1)[:b * s].reshape(b, s, -1)
        tokens = self.face_encoder(vec)
        return jnp.concatenate([jnp.zeros_like(tokens[:, :1]), tokens], axis=1)

    def run_blocks(self, h, ctx, start: int = 0, stop: int | None = None):
        """Main blocks ``start .. stop-1``; after block ``k * inject_face_latents_blocks`` the
        face adapter ``k``'s update (on the unpadded tokens)."""
        cfg = self.cfg
        stop = cfg.num_layers if stop is None else stop
        inj = cfg.inject_face_latents_blocks
        gdef, stacked = nnx.split(self.face_adapter)
        i = start
        while i < stop:
            if i % inj:
                j = min(stop, (i // inj + 1) * inj)
                h = super().run_blocks(h, ctx, i, j)
                i = j
                continue
            h = super().run_blocks(h, ctx, i, i + 1)
            adapter = nnx.merge(gdef, jax.tree.map(lambda p, k=i // inj: p[k], stacked))
            upd = adapter(h[:, :ctx.seq], ctx.hints)
            h = h + jnp.pad(upd, ((0, 0), (0, ctx.pad), (0, 0))).astype(h.dtype)
            h = self.sharding.constrain(h, ("act_batch", "act_seq", "act_embed"))
            i += 1
        return h


__all__ = ["ANIMATE_CLASS", "ANIMATE_FIELDS", "MOTION_CHANNELS", "WanAnimateConfig",
           "WanAnimateTransformer", "check_animate"]
