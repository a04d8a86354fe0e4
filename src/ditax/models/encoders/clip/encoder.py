"""CLIP vision encoder (the ViT-H/14 image encoder of Wan 2.1 I2V / FLF2V), in Flax NNX.

Numerically matches transformers' ``CLIPVisionModel`` (and the vision tower of
``CLIPVisionModelWithProjection``): a bias-free patch-embedding convolution, a learned class
token, learned position embeddings, a LayerNorm *before* the encoder ("pre_layrnorm", spelled
as upstream), pre-norm encoder layers (``x + attn(ln1(x))``, ``x + mlp(ln2(x))``) and a
``post_layernorm`` that upstream applies only to the pooled class token.

Wan conditions on the penultimate hidden states (diffusers' ``encode_image`` returns
``hidden_states[-2]``: the output of all layers but the last, no post-layernorm), which is
:meth:`CLIPVisionEncoder.penultimate`. The last layer is stored and loaded but not run there.

Layers are stacked on a leading axis and run with ``jax.lax.scan`` (compile time flat in
depth; running the first ``n`` layers is a slice of the stack).
Shapes: B batch, C image channels, L tokens (1 + patches), D ``hidden_size``, N heads,
K head dim, M ``intermediate_size``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention import attend
from ditax.errors import ConfigError, RequestError, check_choice
from ditax.nn import FP32LayerNorm, Linear
from ditax.nn.activations import ACTIVATIONS  # transformers' hidden_act names
from ditax.nn.offload import on_device


DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class CLIPVisionConfig:
    """Encoder shape, with transformers' ``CLIPVisionConfig`` field names.

    Defaults are the ViT-H/14 of Wan 2.1 I2V (``image_encoder/config.json`` of the diffusers
    folders); ``dtype`` is the storage and compute dtype (norm statistics and softmax stay
    float32).
    """

    hidden_size: int = 1280
    intermediate_size: int = 5120
    num_hidden_layers: int = 32
    num_attention_heads: int = 16
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 14
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def grid(self) -> int:
        """Patches per side (the convolution floors like torch's)."""
        return self.image_size // self.patch_size

    @property
    def num_positions(self) -> int:
        return self.grid ** 2 + 1

    @classmethod
    def from_hf(cls, cfg: dict, dtype: str = "float32") -> "CLIPVisionConfig":
        """Build from a transformers ``config.json`` (a ``CLIPVisionConfig``, or a full
        ``CLIPConfig`` whose ``vision_config`` is used); refuses what cannot be built."""
        return read_tower_config(cls, cfg, "vision_config", dtype)

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the value for a shape the encoder cannot take."""
        check_layer_shape(self)
        if self.grid < 1:
            raise ConfigError(f"image_size={self.image_size} is smaller than patch_size="
                              f"{self.patch_size}")


def read_tower_config(cls, cfg: dict, section: str, dtype: str, **defaults):
    """A tower's config dataclass ``cls`` from a transformers ``config.json``: the tower's
    own, or a full ``CLIPConfig``'s ``section``; ``defaults`` for keys it may lack; checked."""
    if section in cfg and "hidden_size" not in cfg:
        cfg = cfg[section]
    names = {f.name for f in dataclasses.fields(cls)} - {"dtype"}
    out = cls(**{**defaults, **{k: cfg[k] for k in names if k in cfg}}, dtype=dtype)
    out.check()
    return out


def check_layer_shape(cfg) -> None:
    """The encoder-layer rules both towers share: activation, dtype, heads dividing width."""
    check_choice("hidden_act", cfg.hidden_act, tuple(ACTIVATIONS))
    check_choice("dtype", cfg.dtype, DTYPE_NAMES)
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ConfigError(f"hidden_size={cfg.hidden_size} is not divisible by "
                          f"num_attention_heads={cfg.num_attention_heads}")


def _layer_norm(dim: int, cfg: CLIPVisionConfig) -> FP32LayerNorm:
    return FP32LayerNorm(dim, cfg.layer_norm_eps, affine=True, param_dtype=jnp.dtype(cfg.dtype))


class CLIPVisionEmbeddings(nnx.Module):
    """Pixels ``[B, C, H, W]`` → tokens ``[B, L, D]``: class token, then patches row-major,
    plus position embeddings. The stride-``p`` convolution is a patchify + einsum (same sums)."""

    def __init__(self, cfg: CLIPVisionConfig, rngs: nnx.Rngs):
        p, d, dt = cfg.patch_size, cfg.hidden_size, jnp.dtype(cfg.dtype)
        init = nnx.initializers.normal(0.02)
        self.class_embedding = nnx.Param(init(rngs.params(), (d,), dt))
        self.patch_embedding = nnx.Param(init(rngs.params(), (p, p, cfg.num_channels, d), dt))
        self.position_embedding = nnx.Param(init(rngs.params(), (cfg.num_positions, d), dt))
        self.cfg = cfg

    def __call__(self, pixel_values):
        cfg = self.cfg
        b, c, h, w = pixel_values.shape
        if (c, h, w) != (cfg.num_channels, cfg.image_size, cfg.image_size):
            raise RequestError(
                f"pixel_values must be [B, {cfg.num_channels}, {cfg.image_size}, "
                f"{cfg.image_size}] for this encoder; got {tuple(pixel_values.shape)} "
                f"(preprocess images with ditax.models.encoders.clip.preprocess_images)")
        dt = jnp.dtype(cfg.dtype)
        p, g = cfg.patch_size, cfg.grid
        x = pixel_values[:, :, :g * p, :g * p].astype(dt).reshape(b, c, g, p, g, p)
        patches = jnp.einsum("bcyqxr,qrcd->byxd", x, self.patch_embedding[...].astype(dt))
        cls = jnp.broadcast_to(self.class_embedding[...].astype(dt), (b, 1, cfg.hidden_size))
        tokens = jnp.concatenate([cls, patches.reshape(b, g * g, -1)], axis=1)
        return tokens + self.position_embedding[...].astype(dt)[None]


class CLIPAttention(nnx.Module):
    """Multi-head self-attention with biased projections, ``[B, L, D]``: bidirectional through
    :func:`ditax.attention.attend` (the vision tower), or under a ``mask`` (the text tower's
    causal + padding mask, which ``attend``'s key mask cannot express)."""

    def __init__(self, cfg: CLIPVisionConfig, rngs: nnx.Rngs, attention: str = "xla"):
        d, dt = cfg.hidden_size, jnp.dtype(cfg.dtype)
        kw = dict(dtype=dt, param_dtype=dt, rngs=rngs)
        self.q_proj, self.k_proj = Linear(d, d, **kw), Linear(d, d, **kw)
        self.v_proj, self.out_proj = Linear(d, d, **kw), Linear(d, d, **kw)
        self.heads = cfg.num_attention_heads
        self.attention = attention

    def __call__(self, x, mask=None):
        """x ``[B, L, D]``; mask: None, or bool ``[B, 1, L, L]`` (True = query may see key)."""
        b, l, d = x.shape
        q, k, v = (f(x).reshape(b, l, self.heads, -1) for f in (self.q_proj, self.k_proj,
                                                                self.v_proj))
        if mask is None:
            o = attend(q, k, v, backend=self.attention)  # scale 1/sqrt(K), as upstream
        else:  # same scale; float32 logits and softmax
            o = jax.nn.dot_product_attention(q, k, v, mask=mask)
        return self.out_proj(o.reshape(b, l, d))


class CLIPMLP(nnx.Module):
    """``fc2(act(fc1 x))``, ``[B, L, D] → [B, L, M] → [B, L, D]``."""

    def __init__(self, cfg: CLIPVisionConfig, rngs: nnx.Rngs):
        dt = jnp.dtype(cfg.dtype)
        kw = dict(dtype=dt, param_dtype=dt, rngs=rngs)
        self.fc1 = Linear(cfg.hidden_size, cfg.intermediate_size, **kw)
        self.fc2 = Linear(cfg.intermediate_size, cfg.hidden_size, **kw)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def __call__(self, x):
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nnx.Module):
    """Pre-norm residual layer: ``x + attn(ln1 x)``, then ``x + mlp(ln2 x)``."""

    def __init__(self, cfg: CLIPVisionConfig, rngs: nnx.Rngs, attention: str = "xla"):
        self.layer_norm1 = _layer_norm(cfg.hidden_size, cfg)
        self.self_attn = CLIPAttention(cfg, rngs, attention)
        self.layer_norm2 = _layer_norm(cfg.hidden_size, cfg)
        self.mlp = CLIPMLP(cfg, rngs)

    def __call__(self, x, mask=None):
        x = x + self.self_attn(self.layer_norm1(x).astype(x.dtype), mask)
        return x + self.mlp(self.layer_norm2(x).astype(x.dtype))


def stack_layers(cfg, rngs: nnx.Rngs, attention: str = "xla") -> CLIPEncoderLayer:
    """``cfg.num_hidden_layers`` encoder layers as one module stacked on a leading axis
    (``cfg``: a vision or text config; both name the layer shape the same way)."""
    @nnx.split_rngs(splits=cfg.num_hidden_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_layers(rngs):
        return CLIPEncoderLayer(cfg, rngs, attention)

    return make_layers(rngs)


def run_layers(layers: CLIPEncoderLayer, h, n: int, mask=None):
    """``h [B, L, D]`` through the first ``n`` (>= 1) layers of the stack, scanned."""
    gdef, stacked = nnx.split(layers)
    stacked = jax.tree.map(lambda p: p[:n], stacked)

    def step(hs, layer_state):
        return nnx.merge(gdef, layer_state)(hs, mask), None

    h, _ = jax.lax.scan(step, h, stacked)
    return h


class CLIPVisionEncoder(nnx.Module):
    """CLIP vision tower: ``pixel_values [B, C, S, S]`` → hidden states ``[B, L, D]``.

    ``attention`` names a local backend of :func:`ditax.attention.attend` (default ``xla``).
    """

    def __init__(self, cfg: CLIPVisionConfig, *, rngs: nnx.Rngs, attention: str = "xla"):
        cfg.check()
        self.cfg = cfg
        self.embeddings = CLIPVisionEmbeddings(cfg, rngs)
        self.pre_layrnorm = _layer_norm(cfg.hidden_size, cfg)
        self.layers = stack_layers(cfg, rngs, attention)
        self.post_layernorm = _layer_norm(cfg.hidden_size, cfg)

    @on_device     # weights kept in host memory (text_offload): on the device for the call
    def __call__(self, pixel_values, layers: int | None = None):
        """Hidden states after the first ``layers`` encoder layers (default: all), without
        the post-layernorm: transformers' ``hidden_states[layers]``."""
        n = self.cfg.num_hidden_layers if layers is None else int(layers)
        if not 0 <= n <= self.cfg.num_hidden_layers:
            raise RequestError(f"layers={layers} is outside 0..{self.cfg.num_hidden_layers} "
                               f"(num_hidden_layers)")
        x = jnp.asarray(pixel_values)
        h = self.embeddings(x)
        h = self.pre_layrnorm(h).astype(h.dtype)
        if n == 0:
            return h
        return run_layers(self.layers, h, n)

    def penultimate(self, pixel_values):
        """``[B, L, D]`` hidden states of all layers but the last: what Wan conditions on
        (diffusers' ``image_encoder(...).hidden_states[-2]``)."""
        return self(pixel_values, layers=self.cfg.num_hidden_layers - 1)

    @on_device
    def pooled(self, pixel_values):
        """``[B, D]``: post-layernorm of the last layer's class token (upstream
        ``pooler_output``)."""
        h = self(pixel_values)
        return self.post_layernorm(h[:, 0]).astype(h.dtype)
