"""The config views and rules FLUX.1's and FLUX.2's transformer configs share.

Both are a diffusers architecture (:class:`~ditax.models.common.fields.DiffusersArchitecture`)
of ``num_layers`` double-stream and ``num_single_layers`` single-stream blocks over packed
image tokens and text; a family's config class lists :class:`JointDiTConfig` first among its
bases and its ``check_model`` calls :func:`check_joint_model` before its own rules.
"""

from __future__ import annotations

from ditax.errors import ConfigError
from ditax.models.common.fields import (DiffusersArchitecture, check_numerics,
                                        check_positive_ints)

#: the integer fields both architectures have, each >= 1
POSITIVE = ("patch_size", "in_channels", "num_layers", "num_single_layers",
            "attention_head_dim", "num_attention_heads", "joint_attention_dim")


class JointDiTConfig(DiffusersArchitecture):
    """The shared views of a FLUX.1 / FLUX.2 transformer config (a mixin of the frozen config
    dataclass; ``mlp_dim`` is the family's)."""

    @property
    def inner_dim(self) -> int:
        """``D``, the model width."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def output_channels(self) -> int:
        """Width of the output tokens: ``patch_size² · (out_channels or in_channels)``."""
        return self.patch_size ** 2 * (self.out_channels or self.in_channels)


def check_joint_model(m, positive: tuple, rope_example: str) -> None:
    """The rules both families' configs keep: the numerics, every field of :data:`POSITIVE`
    and ``positive`` (the family's own) an integer >= 1, ``out_channels`` too or None, the
    RoPE axes even and summing to the head dim (``rope_example``: a valid list for the
    message). The family checks the MLP width's tensor split after its own rules
    (:func:`~ditax.models.common.fields.check_tensor_splits`)."""
    check_numerics(m)
    check_positive_ints(m, POSITIVE + tuple(positive), optional=("out_channels",))
    axes = tuple(m.axes_dims_rope)
    if not axes or any(d < 2 or d % 2 for d in axes):
        raise ConfigError(f"model.axes_dims_rope={list(axes)} must be even sizes >= 2, one per "
                          f"position-id axis (RoPE pairs), e.g. {rope_example}")
    if sum(axes) != m.attention_head_dim:
        raise ConfigError(f"model.axes_dims_rope={list(axes)} sums to {sum(axes)}; the axes "
                          f"split the head dim, so they must sum to attention_head_dim="
                          f"{m.attention_head_dim}")


__all__ = ["JointDiTConfig", "check_joint_model", "POSITIVE"]
