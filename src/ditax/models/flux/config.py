"""FLUX.1 transformer configuration (diffusers ``FluxTransformer2DModel`` names) and its rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ditax.errors import ConfigError
from ditax.models.common import fields
from ditax.models.common.fields import (TransformerNumerics, check_numerics, check_tensor_splits,
                                 diffusers_config, with_overrides)

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
class FluxConfig(TransformerNumerics, FluxShape):
    """Flux transformer shape (diffusers names; defaults are diffusers' = FLUX.1-schnell) and
    ditax's numerics (dtypes, remat, layer scan).

    ``num_layers`` double-stream blocks (text and image with their own weights, one joint
    attention) then ``num_single_layers`` single-stream blocks over the joint sequence.
    ``out_channels=None`` means ``in_channels`` (as in diffusers' config.json).
    """

    @property
    def inner_dim(self) -> int:
        """``D``, the model width."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def mlp_dim(self) -> int:
        """``M``, the MLP width of both block kinds."""
        return self.inner_dim * MLP_RATIO

    @property
    def output_channels(self) -> int:
        """Width of the output tokens: ``patch_size² · (out_channels or in_channels)``."""
        return self.patch_size ** 2 * (self.out_channels or self.in_channels)

    @classmethod
    def from_diffusers(cls, cfg: dict, **overrides) -> "FluxConfig":
        """Build from a diffusers ``config.json`` dict (unknown keys ignored)."""
        kw = {k: cfg[k] for k in DIFFUSERS_FIELDS if k in cfg}
        if isinstance(kw.get("axes_dims_rope"), list):
            kw["axes_dims_rope"] = tuple(kw["axes_dims_rope"])
        return with_overrides(cls, kw, overrides)

    def to_diffusers(self) -> dict:
        """The diffusers ``config.json`` dict of this architecture (``_class_name`` included)."""
        return diffusers_config(self, CLASS_NAME, DIFFUSERS_FIELDS)


def check_model(m: FluxConfig, mesh_sizes: dict[str, int] | None = None) -> None:
    """Raise :class:`ConfigError` for a model config that cannot be built (``mesh_sizes``: the
    resolved mesh sizes, for the tensor-parallel divisibility rules)."""
    check_numerics(m)
    for k in ("patch_size", "in_channels", "num_layers", "num_single_layers",
              "attention_head_dim", "num_attention_heads", "joint_attention_dim",
              "pooled_projection_dim"):
        v = getattr(m, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"model.{k}={v!r} must be an integer >= 1")
    if m.out_channels is not None and m.out_channels < 1:
        raise ConfigError(f"model.out_channels={m.out_channels} must be >= 1 (or none: "
                          f"in_channels)")
    axes = tuple(m.axes_dims_rope)
    if not axes or any(d < 2 or d % 2 for d in axes):
        raise ConfigError(f"model.axes_dims_rope={list(axes)} must be even sizes >= 2, one per "
                          f"position-id axis (RoPE pairs), e.g. [16, 56, 56]")
    if sum(axes) != m.attention_head_dim:
        raise ConfigError(f"model.axes_dims_rope={list(axes)} sums to {sum(axes)}; the axes "
                          f"split the head dim, so they must sum to attention_head_dim="
                          f"{m.attention_head_dim}")
    check_tensor_splits(m, mesh_sizes, m.mlp_dim, "model MLP width (4 x inner_dim)")


# every rule of one run, in every family's order, checked once at its entry point
check_transformer = fields.transformer_check(FluxConfig, check_model)


def same_architecture(a: FluxConfig, b: FluxConfig) -> list[tuple[str, object, object]]:
    """``(field, a's, b's)`` for every architecture field where ``a`` and ``b`` differ."""
    return [(f, getattr(a, f), getattr(b, f)) for f in DIFFUSERS_FIELDS
            if getattr(a, f) != getattr(b, f)]


__all__ = ["FluxConfig", "check_model", "check_transformer", "same_architecture",
           "DIFFUSERS_FIELDS", "CLASS_NAME"]
