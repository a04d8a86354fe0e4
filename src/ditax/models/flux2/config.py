"""FLUX.2 transformer configuration (diffusers ``Flux2Transformer2DModel`` names) and its rules.

The presets' architectures (``src/ditax/config/presets/flux.2-*.yaml``) are the values of
diffusers' ``scripts/convert_flux2_to_diffusers.py`` (``get_flux2_transformer_config``):

=================  ======  ========  =====  =====  =====  ======  ========
preset             layers  singles   heads  K      Dt     D       guidance
=================  ======  ========  =====  =====  =====  ======  ========
flux.2-dev         8       48        48     128    15360  6144    yes
flux.2-klein-9b    8       24        32     128    12288  4096    no
flux.2-klein-4b    5       20        24     128    7680   3072    no
=================  ======  ========  =====  =====  =====  ======  ========

and for all: ``in_channels=128`` (32 latent channels packed 2 x 2), ``mlp_ratio=3``,
``axes_dims_rope=(32, 32, 32, 32)``, ``rope_theta=2000``, ``eps=1e-6``,
``timestep_guidance_channels=256``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ditax.errors import ConfigError
from ditax.models.common import fields
from ditax.models.common.bfl.config import JointDiTConfig, check_joint_model
from ditax.models.common.fields import TransformerNumerics, check_tensor_splits

CLASS_NAME = "Flux2Transformer2DModel"

# the fields of a diffusers ``Flux2Transformer2DModel`` config.json (the architecture)
DIFFUSERS_FIELDS = ("patch_size", "in_channels", "out_channels", "num_layers",
                    "num_single_layers", "attention_head_dim", "num_attention_heads",
                    "joint_attention_dim", "timestep_guidance_channels", "mlp_ratio",
                    "axes_dims_rope", "rope_theta", "eps", "guidance_embeds")


@dataclass(frozen=True)
class Flux2Shape:
    """The first fields of :class:`Flux2Config`: the family's name and the architecture (a
    diffusers ``Flux2Transformer2DModel`` config.json's fields; defaults are diffusers' =
    FLUX.2-dev)."""

    family: Literal["flux2"] = "flux2"
    patch_size: int = 1
    in_channels: int = 128
    out_channels: Optional[int] = None
    num_layers: int = 8
    num_single_layers: int = 48
    attention_head_dim: int = 128
    num_attention_heads: int = 48
    joint_attention_dim: int = 15360
    timestep_guidance_channels: int = 256
    mlp_ratio: float = 3.0
    axes_dims_rope: tuple[int, ...] = (32, 32, 32, 32)
    rope_theta: float = 2000.0
    eps: float = 1e-6
    guidance_embeds: bool = True


@dataclass(frozen=True)
class Flux2Config(JointDiTConfig, TransformerNumerics, Flux2Shape):
    """FLUX.2 transformer shape (diffusers names) and ditax's numerics (dtypes, remat, layer
    scan, 8-bit weights).

    ``num_layers`` double-stream blocks (image and text with their own weights, one joint
    attention; the modulation of each stream shared by every block) then
    ``num_single_layers`` single-stream blocks (attention and SwiGLU MLP in parallel, one
    fused input and one fused output projection). No linear layer has a bias.
    ``out_channels=None`` means ``in_channels``. ``text_encoder_out_layers``: the text
    encoder's hidden states a pipeline stacks into the prompt embeddings (None: the folder
    kind's, Qwen3 (9, 18, 27) for klein, Mistral-3 (10, 20, 30) for dev; a folder whose text
    encoder is shallower needs its own, e.g. ``model.text_encoder_out_layers=[1,2,3]``).
    """

    text_encoder_out_layers: Optional[tuple[int, ...]] = None  # text layers read (none: kind's)

    CLASS_NAME = CLASS_NAME
    DIFFUSERS_FIELDS = DIFFUSERS_FIELDS
    FLOAT_FIELDS = ("mlp_ratio", "rope_theta", "eps")

    @property
    def mlp_dim(self) -> int:
        """``M``, the SwiGLU hidden width of both block kinds (``int(D · mlp_ratio)``; the
        input projections write ``2M``: gate and value)."""
        return int(self.inner_dim * self.mlp_ratio)


def check_model(m: Flux2Config, mesh_sizes: dict[str, int] | None = None) -> None:
    """Raise :class:`ConfigError` for a model config that cannot be built (``mesh_sizes``: the
    resolved mesh sizes, for the tensor-parallel divisibility rules)."""
    check_joint_model(m, ("timestep_guidance_channels",), "[32, 32, 32, 32]")
    if m.timestep_guidance_channels % 2:
        raise ConfigError(f"model.timestep_guidance_channels={m.timestep_guidance_channels} "
                          f"must be even (cos and sin halves of the sinusoid), e.g. 256")
    for k in Flux2Config.FLOAT_FIELDS:
        v = getattr(m, k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ConfigError(f"model.{k}={v!r} must be a number > 0")
    if m.mlp_dim < 1:
        raise ConfigError(f"model.mlp_ratio={m.mlp_ratio} gives an MLP width "
                          f"int({m.inner_dim} x {m.mlp_ratio}) = {m.mlp_dim}; use a ratio "
                          f"that gives >= 1 (FLUX.2: 3.0)")
    check_tensor_splits(m, mesh_sizes, m.mlp_dim, "model MLP width (int(D x mlp_ratio))")
    layers = m.text_encoder_out_layers
    if layers is not None and (not layers or any(
            isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers)):
        raise ConfigError(f"model.text_encoder_out_layers={layers!r} must be hidden-state "
                          f"indices >= 0, e.g. [9,18,27] (klein's), or none (the folder's kind's)")


# every rule of one run, in every family's order, checked once at its entry point
check_transformer = fields.transformer_check(Flux2Config, check_model)


__all__ = ["Flux2Config", "check_model", "check_transformer", "DIFFUSERS_FIELDS",
           "CLASS_NAME"]
