"""What the Wan family interface (:class:`~ditax.models.wan.family.WanFamily`) does for a Wan 2.2
Animate config (:class:`~ditax.models.wan.animate.WanAnimateConfig`, the ``model:`` section of
the ``wan2.2-animate-14b`` preset): its rules, module, shardings, tables, the extra per-sample
inputs and their FLOPs — so ``ditax plan`` builds, shards and compiles the Animate transformer.

Per sample, on top of Wan I2V's ``condition`` (mask + reference / condition latents) and
``image`` (CLIP features): ``pose`` ``[z, F - 1, Y, X]`` (the pose video's latents) and
``face`` ``[3, S, P, P]`` (face crops at ``P = motion_encoder_size``, ``S = 4 (F - 2) + 1``
frames: what the face encoder turns into ``F - 1``).
"""

from __future__ import annotations

from ditax.models.wan.animate import WanAnimateConfig, WanAnimateTransformer, check_animate
from ditax.models.wan import animate_convert


def is_animate(m) -> bool:
    return isinstance(m, WanAnimateConfig)


def check(m) -> None:
    check_animate(m)


def create(m, attention, mesh, rngs) -> WanAnimateTransformer:
    return WanAnimateTransformer(m, attention, mesh, rngs=rngs)


param_shardings = animate_convert.param_shardings          # (state, cfg, mesh)
weight_table = animate_convert.config_weight_table         # (cfg) -> Table


def face_frames(latent_frames: int) -> int:
    """Face crops per sample for ``latent_frames`` latent frames (frame 0: the reference)."""
    return 4 * (latent_frames - 2) + 1


def condition_shapes(m: WanAnimateConfig, latent_shape) -> dict[str, tuple[int, ...]]:
    """The Animate entries beyond Wan I2V's (module docstring)."""
    _, f, y, x = latent_shape
    p = m.motion_encoder_size
    return {"pose": (m.latent_channels, f - 1, y, x), "face": (3, face_frames(f), p, p)}


def call_inputs(condition, dtype) -> dict:
    """The Animate transformer's keyword arguments from a sample's condition entries."""
    return {"pose_hidden_states": condition["pose"].astype(dtype),
            "face_pixel_values": condition["face"].astype(dtype)}


def forward_flops(m: WanAnimateConfig, latent_shape, tokens: int) -> float:
    """Forward matmul FLOPs the Animate paths add to Wan's: the pose patch embedding and the
    face adapters (q, k, v, out projections and attention to each frame's ``n + 1`` face
    tokens). The motion encoder (convs on each 512² crop; ~0.3% of a 14B 720p forward) and
    the face encoder's 1-D convs are not counted."""
    _, f, _, _ = latent_shape
    D = m.inner_dim
    _, ph, pw = m.patch_size
    face_tokens = f * (m.face_encoder_num_heads + 1)
    per_adapter = 4 * tokens * D * D + 4 * face_tokens * D * D + 4 * tokens * (
        m.face_encoder_num_heads + 1) * D
    pose = 2 * tokens * m.latent_channels * ph * pw * D
    return float(pose + m.num_face_adapters * per_adapter)


__all__ = ["call_inputs", "check", "condition_shapes", "create", "face_frames", "forward_flops",
           "is_animate", "param_shardings", "weight_table"]
