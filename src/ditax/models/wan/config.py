"""Wan transformer configuration (diffusers ``WanTransformer3DModel`` names) and its rules."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, get_args

from ditax.errors import ConfigError, check_choice
from ditax.parallel.mesh import check_tensor_split

DType = Literal["float32", "bfloat16", "float16"]
Remat = Literal["none", "full", "save_dots", "save_dots_no_batch", "save_attn_out"]
QKNorm = Literal["rms_norm_across_heads"]
DTYPES = get_args(DType)
REMAT_POLICIES = get_args(Remat)


@dataclass(frozen=True)
class ModelConfig:
    """Wan transformer shape (diffusers ``WanTransformer3DModel`` config names) and numerics.

    ``family`` names the model family in a config file (``model.family``); see
    :mod:`ditax.config.families`.
    """

    family: Literal["wan"] = "wan"
    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 12
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 8960
    num_layers: int = 30
    cross_attn_norm: bool = True
    qk_norm: QKNorm = "rms_norm_across_heads"
    eps: float = 1e-6
    rope_max_seq_len: int = 1024
    param_dtype: DType = "float32"   # storage dtype of the weights
    dtype: DType = "float32"         # compute dtype of matmuls / attention
    remat: Remat = "none"            # activation checkpointing policy of each block
    scan_layers: bool = True

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @classmethod
    def from_diffusers(cls, cfg: dict, **overrides) -> "ModelConfig":
        """Build from a diffusers ``config.json`` dict (unknown keys ignored, I2V keys refused)."""
        if cfg.get("image_dim") is not None or cfg.get("added_kv_proj_dim") is not None:
            raise ConfigError(
                "this transformer config has image_dim/added_kv_proj_dim set (an image-to-video "
                "model); ditax implements text-to-video Wan only. Use a T2V checkpoint.")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in cfg.items() if k in names}
        if "patch_size" in kw:
            kw["patch_size"] = tuple(kw["patch_size"])
        if kw.get("qk_norm") is None and "qk_norm" in cfg:
            raise ConfigError("qk_norm=None is not supported; Wan uses 'rms_norm_across_heads'")
        kw.update(overrides)
        return cls(**kw)


def check_model(m: ModelConfig, mesh_sizes: dict[str, int] | None = None) -> None:
    """Raise :class:`ConfigError` for a model config that cannot be built (``mesh_sizes``: the
    resolved mesh sizes, for the tensor-parallel divisibility rules)."""
    check_choice("model.param_dtype", m.param_dtype, DTYPES)
    check_choice("model.dtype", m.dtype, DTYPES)
    check_choice("model.remat", m.remat, REMAT_POLICIES)
    check_choice("model.qk_norm", m.qk_norm, get_args(QKNorm))
    for k in ("num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
              "text_dim", "freq_dim", "ffn_dim", "num_layers"):
        if getattr(m, k) < 1:
            raise ConfigError(f"model.{k}={getattr(m, k)} must be >= 1")
    if m.attention_head_dim % 2:
        raise ConfigError(f"model.attention_head_dim={m.attention_head_dim} must be even (RoPE pairs)")
    if m.freq_dim % 2:
        raise ConfigError(f"model.freq_dim={m.freq_dim} must be even (sin/cos halves)")
    if any(p < 1 for p in m.patch_size):
        raise ConfigError(f"model.patch_size={m.patch_size} must be positive")
    if mesh_sizes is not None:
        check_tensor_split(m.num_attention_heads, mesh_sizes, "model.num_attention_heads")
        check_tensor_split(m.ffn_dim, mesh_sizes, "model.ffn_dim")
