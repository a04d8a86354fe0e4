"""LTX-2 audio+video transformer configuration (diffusers ``LTX2VideoTransformer3DModel`` names)
and its rules.

Every field of diffusers 0.42.1's ``LTX2VideoTransformer3DModel`` config is one here, with
diffusers' default; the presets ``ltx-2`` and ``ltx-2.3`` hold the released models' values
(diffusers' ``scripts/convert_ltx2_to_diffusers.py``). A ``config.json`` key this version
does not know is refused (:func:`check_known_keys`), never dropped: a newer model's feature
would otherwise be silently missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ditax.errors import ConfigError
from ditax.models.common import fields
from ditax.models.common.fields import (DiffusersArchitecture, TransformerNumerics,
                                        check_numerics, check_positive_ints)

CLASS_NAME = "LTX2VideoTransformer3DModel"
MLP_RATIO = 4        # both feed-forwards: M = 4 x the stream's width (fixed in diffusers)
QK_EPS = 1e-6        # the attentions' q / k RMS norms (diffusers does not pass norm_eps to them)
OUT_EPS = 1e-6       # the output LayerNorms
ROPE_TYPES = ("interleaved", "split")

# the fields of a diffusers ``LTX2VideoTransformer3DModel`` config.json (the architecture)
DIFFUSERS_FIELDS = (
    "in_channels", "out_channels", "patch_size", "patch_size_t", "num_attention_heads",
    "attention_head_dim", "cross_attention_dim", "vae_scale_factors", "pos_embed_max_pos",
    "base_height", "base_width", "gated_attn", "cross_attn_mod",
    "audio_in_channels", "audio_out_channels", "audio_patch_size", "audio_patch_size_t",
    "audio_num_attention_heads", "audio_attention_head_dim", "audio_cross_attention_dim",
    "audio_scale_factor", "audio_pos_embed_max_pos", "audio_sampling_rate", "audio_hop_length",
    "audio_gated_attn", "audio_cross_attn_mod",
    "num_layers", "activation_fn", "qk_norm", "norm_elementwise_affine", "norm_eps",
    "caption_channels", "attention_bias", "attention_out_bias", "rope_theta",
    "rope_double_precision", "causal_offset", "timestep_scale_multiplier",
    "cross_attn_timestep_scale_multiplier", "rope_type", "use_prompt_embeddings",
    "perturbed_attn", "ff_bias", "audio_ff_bias", "use_prompt_adaln_single",
    "use_keyframes_abs_pos_embedding")


@dataclass(frozen=True)
class LTX2Shape:
    """The first fields of :class:`LTX2Config`: the family's name and the architecture (a
    diffusers ``LTX2VideoTransformer3DModel`` config.json's fields, diffusers' defaults)."""

    family: Literal["ltx2"] = "ltx2"
    # video stream
    in_channels: int = 128
    out_channels: Optional[int] = 128
    patch_size: int = 1
    patch_size_t: int = 1
    num_attention_heads: int = 32
    attention_head_dim: int = 128
    cross_attention_dim: int = 4096
    vae_scale_factors: tuple[int, int, int] = (8, 32, 32)
    pos_embed_max_pos: int = 20
    base_height: int = 2048
    base_width: int = 2048
    gated_attn: bool = False
    cross_attn_mod: bool = False
    # audio stream
    audio_in_channels: int = 128
    audio_out_channels: Optional[int] = 128
    audio_patch_size: int = 1
    audio_patch_size_t: int = 1
    audio_num_attention_heads: int = 32
    audio_attention_head_dim: int = 64
    audio_cross_attention_dim: int = 2048
    audio_scale_factor: int = 4
    audio_pos_embed_max_pos: int = 20
    audio_sampling_rate: int = 16000
    audio_hop_length: int = 160
    audio_gated_attn: bool = False
    audio_cross_attn_mod: bool = False
    # shared
    num_layers: int = 48
    activation_fn: str = "gelu-approximate"
    qk_norm: str = "rms_norm_across_heads"
    norm_elementwise_affine: bool = False
    norm_eps: float = 1e-6
    caption_channels: int = 3840
    attention_bias: bool = True
    attention_out_bias: bool = True
    rope_theta: float = 10000.0
    rope_double_precision: bool = True
    causal_offset: int = 1
    timestep_scale_multiplier: int = 1000
    cross_attn_timestep_scale_multiplier: int = 1000
    rope_type: str = "interleaved"
    use_prompt_embeddings: bool = True
    perturbed_attn: bool = False
    ff_bias: bool = True
    audio_ff_bias: bool = True
    use_prompt_adaln_single: bool = True
    use_keyframes_abs_pos_embedding: bool = False


@dataclass(frozen=True)
class LTX2Config(DiffusersArchitecture, TransformerNumerics, LTX2Shape):
    """LTX-2 transformer shape (diffusers names and defaults) and ditax's numerics (dtypes,
    remat, layer scan).

    ``num_layers`` blocks, each updating a video stream (``D = num_attention_heads x
    attention_head_dim``) and an audio stream (``Da = audio_num_attention_heads x
    audio_attention_head_dim``): self-attention, text cross-attention, audio→video and
    video→audio cross-attention (audio heads), feed-forward. ``out_channels=None`` means
    ``in_channels`` (likewise for audio), as in diffusers.
    """

    CLASS_NAME = CLASS_NAME
    DIFFUSERS_FIELDS = DIFFUSERS_FIELDS

    @property
    def inner_dim(self) -> int:
        """``D``, the video stream's width."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def audio_inner_dim(self) -> int:
        """``Da``, the audio stream's width (also the a↔v cross-attentions' width)."""
        return self.audio_num_attention_heads * self.audio_attention_head_dim

    @property
    def video_out_channels(self) -> int:
        return self.out_channels or self.in_channels

    @property
    def audio_output_channels(self) -> int:
        return self.audio_out_channels or self.audio_in_channels

    @property
    def prompt_modulation(self) -> bool:
        """Whether the blocks modulate the text keys / values (LTX-2.3): either stream's
        ``cross_attn_mod``; both streams then have the per-block prompt tables."""
        return self.cross_attn_mod or self.audio_cross_attn_mod

    @property
    def prompt_adaln(self) -> bool:
        """Whether that modulation depends on ``sigma`` (the ``prompt_adaln`` embedders)."""
        return self.prompt_modulation and self.use_prompt_adaln_single

    @property
    def video_mod_params(self) -> int:
        return 9 if self.cross_attn_mod else 6

    @property
    def audio_mod_params(self) -> int:
        return 9 if self.audio_cross_attn_mod else 6

    @property
    def text_dim(self) -> int:
        """Width of ``encoder_hidden_states``: the caption features (LTX-2, projected in the
        model) or the connector's output (LTX-2.3, ``use_prompt_embeddings=False``)."""
        return self.caption_channels if self.use_prompt_embeddings else self.cross_attention_dim

    @property
    def audio_text_dim(self) -> int:
        """Width of ``audio_encoder_hidden_states``."""
        return (self.caption_channels if self.use_prompt_embeddings
                else self.audio_cross_attention_dim)

    @property
    def cross_pos_max(self) -> int:
        """The time scale of the a↔v cross-attention RoPE (diffusers: the larger base)."""
        return max(self.pos_embed_max_pos, self.audio_pos_embed_max_pos)

    @property
    def audio_latents_per_second(self) -> float:
        return self.audio_sampling_rate / self.audio_hop_length / self.audio_scale_factor

    @classmethod
    def from_diffusers(cls, cfg: dict, **overrides) -> "LTX2Config":
        """Build from a diffusers ``config.json`` dict; a key that is no field here (and no
        ``_``-metadata) is refused (:func:`check_known_keys`)."""
        check_known_keys(cfg)
        return super().from_diffusers(cfg, **overrides)


def check_known_keys(raw: dict) -> None:
    """:class:`ConfigError` for a ``config.json`` key this version does not implement (a newer
    diffusers' feature), naming it: refused, not silently left out. A ditax 8-bit folder's
    ``quantization_config`` (``quant_method: ditax``, written by ``ditax convert --quantize``)
    is the loader's to read (:func:`ditax.nn.quant.folder_mode`); any other is refused."""
    ours = (raw.get("quantization_config") or {}).get("quant_method") == "ditax"
    unknown = sorted(k for k in raw if not k.startswith("_") and k not in DIFFUSERS_FIELDS
                     and not (k == "quantization_config" and ours))
    if unknown:
        raise ConfigError(f"config.json key(s) {', '.join(unknown)}: ditax does not support "
                          f"{'them' if len(unknown) > 1 else 'it'} yet (it implements "
                          f"diffusers 0.42.1's {CLASS_NAME}); remove the key(s) only if the "
                          f"model does not use them")


_POSITIVE = ("in_channels", "patch_size", "patch_size_t", "num_attention_heads",
             "attention_head_dim", "cross_attention_dim", "pos_embed_max_pos", "base_height",
             "base_width", "audio_in_channels", "audio_patch_size", "audio_patch_size_t",
             "audio_num_attention_heads", "audio_attention_head_dim",
             "audio_cross_attention_dim", "audio_scale_factor", "audio_pos_embed_max_pos",
             "audio_sampling_rate", "audio_hop_length", "num_layers", "caption_channels",
             "timestep_scale_multiplier")


def check_model(m: LTX2Config, mesh_sizes: dict[str, int] | None = None) -> None:
    """Raise :class:`ConfigError` for a model config that cannot be built (``mesh_sizes``: the
    resolved mesh sizes, for the tensor-parallel divisibility rules)."""
    check_numerics(m)
    check_positive_ints(m, _POSITIVE, ("out_channels", "audio_out_channels"),
                        "the input channels")
    if len(m.vae_scale_factors) != 3 or any(f < 1 for f in m.vae_scale_factors):
        raise ConfigError(f"model.vae_scale_factors={list(m.vae_scale_factors)} must be three "
                          f"factors >= 1 (frames, height, width), e.g. [8, 32, 32]")
    for key, value, fix in (
            ("activation_fn", m.activation_fn, "gelu-approximate"),
            ("qk_norm", m.qk_norm, "rms_norm_across_heads")):
        if value != fix:
            raise ConfigError(f"model.{key}={value!r}: ditax does not support it yet (LTX-2 "
                              f"uses {fix!r}, as diffusers does)")
    if m.rope_type not in ROPE_TYPES:
        raise ConfigError(f"model.rope_type={m.rope_type!r} is not one of "
                          f"{', '.join(ROPE_TYPES)}")
    if m.norm_eps <= 0:
        raise ConfigError(f"model.norm_eps={m.norm_eps} must be > 0")
    if m.causal_offset < 0 or m.cross_attn_timestep_scale_multiplier < 0:
        raise ConfigError(f"model.causal_offset={m.causal_offset} and model.cross_attn_"
                          f"timestep_scale_multiplier={m.cross_attn_timestep_scale_multiplier}"
                          f" must be >= 0")
    for key, k in (("attention_head_dim", m.attention_head_dim),
                   ("audio_attention_head_dim", m.audio_attention_head_dim)):
        if k % 2:
            raise ConfigError(f"model.{key}={k} must be even (RoPE rotates channel pairs)")
    # the a<->v attentions are Da wide, and their RoPE tables are audio_cross_attention_dim wide
    if m.audio_cross_attention_dim != m.audio_inner_dim:
        raise ConfigError(f"model.audio_cross_attention_dim={m.audio_cross_attention_dim} must "
                          f"equal the audio width audio_num_attention_heads x audio_attention_"
                          f"head_dim = {m.audio_inner_dim} (the audio<->video RoPE is that wide)")
    if m.use_prompt_embeddings and m.cross_attention_dim != m.inner_dim:
        raise ConfigError(f"model.cross_attention_dim={m.cross_attention_dim} must equal the "
                          f"video width {m.inner_dim} when use_prompt_embeddings=true (the "
                          f"caption projection's output is the text keys' input)")
    if m.prompt_modulation and m.cross_attention_dim != m.inner_dim:
        raise ConfigError(f"model.cross_attention_dim={m.cross_attention_dim} must equal the "
                          f"video width {m.inner_dim} with cross_attn_mod (the text is "
                          f"modulated by {m.inner_dim}-wide tables before its keys)")
    if m.rope_type == "split":
        for what, width, heads in (
                ("video self-attention", m.inner_dim, m.num_attention_heads),
                ("audio self-attention", m.audio_inner_dim, m.audio_num_attention_heads),
                ("audio<->video (video side)", m.audio_inner_dim, m.num_attention_heads)):
            if (width // 2) % heads:
                raise ConfigError(f"model.rope_type='split': the {what} RoPE splits {width // 2}"
                                  f" frequencies over {heads} heads; they must divide")
    if mesh_sizes is not None:
        from ditax.parallel.mesh import check_tensor_split

        check_tensor_split(m.num_attention_heads, mesh_sizes, "model.num_attention_heads")
        check_tensor_split(m.audio_num_attention_heads, mesh_sizes,
                           "model.audio_num_attention_heads")
        check_tensor_split(m.inner_dim * MLP_RATIO, mesh_sizes, "model video MLP width")
        check_tensor_split(m.audio_inner_dim * MLP_RATIO, mesh_sizes, "model audio MLP width")


# every rule of one run, in every family's order, checked once at its entry point
check_transformer = fields.transformer_check(LTX2Config, check_model)


__all__ = ["LTX2Config", "check_model", "check_transformer", "check_known_keys",
           "DIFFUSERS_FIELDS", "CLASS_NAME"]
