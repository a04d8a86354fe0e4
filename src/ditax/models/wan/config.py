"""Wan transformer configuration (diffusers ``WanTransformer3DModel`` names) and its rules."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ditax.errors import ConfigError, check_choice

DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "save_dots", "save_dots_no_batch", "save_attn_out")


@dataclass(frozen=True)
class ModelConfig:
    """Wan transformer shape (diffusers ``WanTransformer3DModel`` config names) and numerics."""

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
    qk_norm: str = "rms_norm_across_heads"
    eps: float = 1e-6
    rope_max_seq_len: int = 1024
    param_dtype: str = "float32"   # storage dtype of the weights
    dtype: str = "float32"         # compute dtype of matmuls / attention
    remat: str = "none"            # none | full | save_dots | save_dots_no_batch | save_attn_out
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



def check_model(m: ModelConfig, tensor: int | None = None) -> None:
    """Raise :class:`ConfigError` for a model config that cannot be built (``tensor``: the
    resolved ``mesh.tensor`` size, for the divisibility rules)."""
    check_choice("model.param_dtype", m.param_dtype, DTYPES)
    check_choice("model.dtype", m.dtype, DTYPES)
    check_choice("model.remat", m.remat, REMAT_POLICIES)
    if m.qk_norm != "rms_norm_across_heads":
        raise ConfigError(f"model.qk_norm={m.qk_norm!r}: only 'rms_norm_across_heads' (Wan) exists")
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
    if tensor is None:
        return
    if m.num_attention_heads % tensor:
        raise ConfigError(
            f"model.num_attention_heads={m.num_attention_heads} is not divisible by "
            f"mesh.tensor={tensor}; pick a tensor size that divides the heads")
    if m.ffn_dim % tensor:
        raise ConfigError(f"model.ffn_dim={m.ffn_dim} is not divisible by mesh.tensor={tensor}")
