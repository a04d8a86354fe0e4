"""Wan transformer configuration (diffusers ``WanTransformer3DModel`` names) and its rules."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Optional, get_args

from ditax.errors import ConfigError, check_choice
from ditax.models.common import fields
from ditax.models.common.fields import (DTYPES, REMAT_POLICIES, DType, Quantize, Remat,  # noqa: F401
                                 TransformerNumerics, check_numerics, check_overrides,
                                 check_tensor_splits,
                                 diffusers_config, with_overrides)

QKNorm = Literal["rms_norm_across_heads"]
Vae = Literal["wan2.1", "wan2.2"]
# the attention layers' q / k projections (ditax.nn.head_projection)
Projections = Literal["auto", "xla", "fused"]

CLASS_NAME = "WanTransformer3DModel"
# the fields of a diffusers ``WanTransformer3DModel`` config.json (the architecture)
DIFFUSERS_FIELDS = ("patch_size", "num_attention_heads", "attention_head_dim", "in_channels",
                    "out_channels", "text_dim", "freq_dim", "ffn_dim", "num_layers",
                    "cross_attn_norm", "qk_norm", "eps", "image_dim", "added_kv_proj_dim",
                    "rope_max_seq_len", "pos_embed_seq_len")


@dataclass(frozen=True)
class WanShape:
    """The first fields of :class:`WanConfig`: the family's name and the text-to-video
    architecture; :class:`~ditax.models.common.fields.TransformerNumerics` follows them."""

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


@dataclass(frozen=True)
class WanConfig(TransformerNumerics, WanShape):
    """Wan transformer shape (diffusers ``WanTransformer3DModel`` config names) and numerics.

    ``family`` names the model family in a config file (``model.family``; the family registry
    :mod:`ditax.models.registry`). ``ModelConfig`` is the same class under its older name.
    """

    # image-to-video (Wan 2.1 I2V / FLF2V); None = text-to-video
    image_dim: Optional[int] = None          # CLIP feature width fed to the image embedder
    added_kv_proj_dim: Optional[int] = None  # input width of attn2.add_k_proj / add_v_proj
    pos_embed_seq_len: Optional[int] = None  # FLF2V: image tokens of both frames (2 x 257)
    # not in a transformer's config.json (a pipeline's): which VAE makes the latents
    # (wan2.2: the TI2V-5B VAE, 16x spatial) and Wan 2.2 TI2V's per-token timesteps
    vae: Vae = "wan2.1"
    # the VAE's dtype where a pipeline loads it (load_pipeline's vae_dtype=): float32, Wan's
    # own and the default; bfloat16 decodes faster on a TPU (480x832x81: 3.44 s against
    # 4.44 s on a v5e) within ~1e-2 of float32 on [-1, 1] pixels (tests/pipelines/wan)
    vae_dtype: DType = "float32"
    expand_timesteps: bool = False
    # VACE (diffusers ``WanVACETransformer3DModel``): the blocks after which a control hint is
    # added and the control context's channels; () = no VACE branch (rules: models.wan.vace)
    vace_layers: tuple[int, ...] = ()
    vace_in_channels: int = 96
    # a causal student (issue 59): self-attention block-causal over chunks of this many latent
    # frames (models.wan.causal); None = bidirectional. Written to config.json when set
    causal_chunk: Optional[int] = None
    # the attention layers' q (and self-attention's k) projections in the head-major (TPU
    # kernels') layout: fused = one Pallas kernel each with its norm, RoPE and the softmax
    # scale (ditax.nn.head_projection; bfloat16, full-precision weights, one device); xla =
    # XLA's dot and fusions; auto = fused on one TPU chip where it runs, else xla
    projections: Projections = "auto"

    # its transformer honours attention.sparsity (tile-major video tokens; not a field)
    SPARSE_ATTENTION = True

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def image_condition(self) -> str:
        """How an image conditions the model: ``"channels"`` (Wan I2V: noise, mask and
        condition latents concatenated, ``in_channels > out_channels``), ``"expand"`` (Wan 2.2
        TI2V: the first latent frame replaced, its tokens at t=0) or ``"none"``."""
        if self.expand_timesteps:
            return "expand"
        return "channels" if self.in_channels != self.out_channels else "none"

    @classmethod
    def from_diffusers(cls, cfg: dict, **overrides) -> "WanConfig":
        """Build from a diffusers ``config.json`` dict (unknown keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in cfg.items() if k in names}
        for k in ("patch_size", "vace_layers"):    # JSON lists
            if k in kw:
                kw[k] = tuple(int(i) for i in kw[k])
        if kw.get("qk_norm") is None and "qk_norm" in cfg:
            raise ConfigError("qk_norm=None is not supported; Wan uses 'rms_norm_across_heads'")
        return with_overrides(cls, kw, overrides)

    def to_diffusers(self) -> dict:
        """The diffusers ``config.json`` dict of this architecture (``_class_name`` included;
        numerics such as dtypes and remat are ditax's own and not written; a causal student's
        ``causal_chunk``, which diffusers ignores, is)."""
        out = diffusers_config(self, CLASS_NAME, DIFFUSERS_FIELDS)
        return out if self.causal_chunk is None else {**out, "causal_chunk": self.causal_chunk}


# the class's older name, kept for the public surface (ditax.config.ModelConfig) and configs
ModelConfig = WanConfig


def check_model(m: WanConfig, mesh_sizes: dict[str, int] | None = None) -> None:
    """Raise :class:`ConfigError` for a model config that cannot be built (``mesh_sizes``: the
    resolved mesh sizes, for the tensor-parallel divisibility rules)."""
    check_numerics(m)
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
    check_choice("model.vae", m.vae, get_args(Vae))
    check_choice("model.vae_dtype", m.vae_dtype, DTYPES)
    _check_projections(m, mesh_sizes)
    _check_image(m)
    if m.expand_timesteps and m.in_channels != m.out_channels:
        raise ConfigError(f"model.expand_timesteps (Wan 2.2 TI2V) replaces the first latent "
                          f"frame instead of adding channels: in_channels={m.in_channels} must "
                          f"equal out_channels={m.out_channels}")
    check_tensor_splits(m, mesh_sizes, m.ffn_dim, "model.ffn_dim")
    _check_causal(m)


_check_transformer = fields.transformer_check(WanConfig, check_model)


def check_transformer(m, attention=None, mesh_sizes: dict[str, int] | None = None) -> None:
    """Every rule of one Wan run, in every family's order, checked once at its entry point
    (:func:`ditax.models.common.fields.transformer_check`), then ``model.causal_chunk``
    against ``attention.sparsity`` (block-causal needs frame-major tokens)."""
    _check_transformer(m, attention, mesh_sizes)
    if attention is not None and attention.sparsity == "vsa" and (m.vace_layers or
                                                                  m.quantize != "none"):
        what = "VACE blocks" if m.vace_layers else f"model.quantize={m.quantize}"
        raise ConfigError(f"attention.sparsity=vsa (gated self-attention) is not wired for "
                          f"{what}; use attention.sparsity=none or a plain Wan model")
    if m.causal_chunk is not None and attention is not None:
        from ditax.models.wan.causal import check_causal

        check_causal(m.causal_chunk, None, m.patch_size[0], sparsity=attention.sparsity)


def _check_projections(m: WanConfig, mesh_sizes: dict[str, int] | None) -> None:
    """``model.projections=fused`` asks for the kernel (:mod:`ditax.nn.head_projection`):
    refused where it cannot run rather than run as XLA's (auto picks per call)."""
    check_choice("model.projections", m.projections, get_args(Projections))
    if m.projections != "fused":
        return
    devices = math.prod((mesh_sizes or {}).values())
    why = ("model.dtype is " + m.dtype if m.dtype != "bfloat16" else
           f"model.quantize={m.quantize}" if m.quantize != "none" else
           f"the mesh has {devices} devices" if devices > 1 else
           f"attention_head_dim={m.attention_head_dim} is not a multiple of 128"
           if m.attention_head_dim % 128 else None)
    if why:
        raise ConfigError(f"model.projections=fused runs bfloat16 full-precision weights on "
                          f"one device with 128-lane heads, but {why}; use "
                          f"model.projections=auto or xla")


def _check_causal(m: WanConfig) -> None:
    """``model.causal_chunk``: a positive multiple of the temporal patch, on a text-to-video
    model (the causal sampler and the KV cache take no image or control conditioning)."""
    if m.causal_chunk is None:
        return
    from ditax.models.wan.causal import check_causal

    check_causal(m.causal_chunk, None, m.patch_size[0])
    if m.image_dim is not None or m.vace_layers or m.expand_timesteps:
        raise ConfigError(f"model.causal_chunk={m.causal_chunk} is for text-to-video Wan; this "
                          f"model is conditioned on images or control video (image_dim, "
                          f"vace_layers or expand_timesteps set); set model.causal_chunk=none")


def _check_image(m: WanConfig) -> None:
    """The image-to-video fields come together: the image embedder's tokens (width
    ``inner_dim``) are what the added K/V projections read."""
    if (m.image_dim is None) != (m.added_kv_proj_dim is None):
        raise ConfigError(f"model.image_dim={m.image_dim} and model.added_kv_proj_dim="
                          f"{m.added_kv_proj_dim} must be set together (image-to-video) or both "
                          f"be none (text-to-video)")
    if m.image_dim is None:
        if m.pos_embed_seq_len is not None:
            raise ConfigError(f"model.pos_embed_seq_len={m.pos_embed_seq_len} needs "
                              f"model.image_dim (first-last-frame models are image-to-video)")
        return
    for k in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"):
        v = getattr(m, k)
        if v is not None and v < 1:
            raise ConfigError(f"model.{k}={v} must be >= 1")
    if m.added_kv_proj_dim != m.inner_dim:
        raise ConfigError(f"model.added_kv_proj_dim={m.added_kv_proj_dim} must equal the model "
                          f"width num_attention_heads*attention_head_dim={m.inner_dim} (the "
                          f"image embedder's output)")
    if m.pos_embed_seq_len is not None and m.pos_embed_seq_len % 2:
        raise ConfigError(f"model.pos_embed_seq_len={m.pos_embed_seq_len} must be even (the "
                          f"tokens of two images)")
