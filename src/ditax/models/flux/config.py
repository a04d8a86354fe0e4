"""FLUX.1 transformer configuration (diffusers ``FluxTransformer2DModel`` names) and its rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ditax.models.common import fields
from ditax.models.common.bfl.config import JointDiTConfig, check_joint_model
from ditax.models.common.fields import TransformerNumerics, check_tensor_splits

CLASS_NAME = "FluxTransformer2DModel"
MLP_RATIO = 4        # both block kinds: MLP width = 4 x model width (fixed in diffusers)
ROPE_THETA = 10000.0
EPS = 1e-6           # every norm of the model (fixed in diffusers)

# the fields of a diffusers ``FluxTransformer2DModel`` config.json (the architecture)
DIFFUSERS_FIELDS = ("patch_size", "in_channels", "out_channels", "num_layers",
                    "num_single_layers", "attention_head_dim", "num_attention_heads",
                    "joint_attention_dim", "pooled_projection_dim", "guidance_embeds",
                    "axes_dims_rope")


@dataclass(frozen=True)
class FluxShape:
    """The first fields of :class:`FluxConfig`: the family's name and the architecture (a
    diffusers ``FluxTransformer2DModel`` config.json's fields)."""

    family: Literal["flux"] = "flux"
    patch_size: int = 1
    in_channels: int = 64
    out_channels: Optional[int] = None
    num_layers: int = 19
    num_single_layers: int = 38
    attention_head_dim: int = 128
    num_attention_heads: int = 24
    joint_attention_dim: int = 4096
    pooled_projection_dim: int = 768
    guidance_embeds: bool = False
    axes_dims_rope: tuple[int, ...] = (16, 56, 56)


@dataclass(frozen=True)
class FluxConfig(JointDiTConfig, TransformerNumerics, FluxShape):
    """Flux transformer shape (diffusers names; defaults are diffusers' = FLUX.1-schnell) and
    ditax's numerics (dtypes, remat, layer scan).

    ``num_layers`` double-stream blocks (text and image with their own weights, one joint
    attention) then ``num_single_layers`` single-stream blocks over the joint sequence.
    ``out_channels=None`` means ``in_channels`` (as in diffusers' config.json).
    """

    CLASS_NAME = CLASS_NAME
    DIFFUSERS_FIELDS = DIFFUSERS_FIELDS

    @property
    def mlp_dim(self) -> int:
        """``M``, the MLP width of both block kinds."""
        return self.inner_dim * MLP_RATIO


def check_model(m: FluxConfig, mesh_sizes: dict[str, int] | None = None) -> None:
    """Raise :class:`ConfigError` for a model config that cannot be built (``mesh_sizes``: the
    resolved mesh sizes, for the tensor-parallel divisibility rules)."""
    check_joint_model(m, ("pooled_projection_dim",), "[16, 56, 56]")
    check_tensor_splits(m, mesh_sizes, m.mlp_dim, "model MLP width (4 x inner_dim)")


# every rule of one run, in every family's order, checked once at its entry point
check_transformer = fields.transformer_check(FluxConfig, check_model)


__all__ = ["FluxConfig", "check_model", "check_transformer", "DIFFUSERS_FIELDS", "CLASS_NAME"]
