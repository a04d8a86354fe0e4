"""UMT5 text encoder (the encoder half of umT5-XXL that Wan conditions on), in Flax NNX.

Numerically matches transformers' ``UMT5EncoderModel``. What differs from a textbook transformer:

- every layer owns a relative position bias table ``[buckets, N]`` (T5 shares one from layer 0;
  UMT5 does not), added to the attention logits;
- attention logits are NOT scaled by ``1/sqrt(K)`` (T5 folds that into the initialisation);
- norms are T5 RMS norms: no mean subtraction, no bias, variance in float32;
- the MLP is gated (``wo(act(wi_0 x) * wi_1 x)``) with the tanh GELU for ``gated-gelu``.

Module names mirror the transformers keys so that :func:`load_text_encoder` is a table.
Shapes: B batch, T text tokens, D ``d_model``, N heads, K ``d_kv``, M ``d_ff``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.io.convert import TRANSPOSE, Row, Table, load_params
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights

# transformers' activation names → JAX functions (the gated-gelu of T5 v1.1 / UMT5 is "gelu_new").
_ACTIVATIONS = {
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def _dtype(d):
    """``jnp.dtype(d)``, refusing anything that is not a floating-point type."""
    try:
        dt = jnp.dtype(d)
    except TypeError:
        dt = None
    if dt is None or not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"dtype={d!r} is not supported; use float32, bfloat16 or float16")
    return dt


@dataclass(frozen=True)
class UMT5Config:
    """Encoder shape, with transformers' ``UMT5Config`` field names."""

    vocab_size: int = 256384
    d_model: int = 4096
    d_kv: int = 64
    d_ff: int = 10240
    num_layers: int = 24
    num_heads: int = 64
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "gated-gelu"
    dtype: str = "float32"  # storage and compute dtype (norm statistics and softmax stay float32)

    @property
    def is_gated(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def act_name(self) -> str:
        # transformers maps the literal "gated-gelu" to the tanh approximation.
        if self.feed_forward_proj == "gated-gelu":
            return "gelu_new"
        return self.feed_forward_proj.split("-")[-1]

    @classmethod
    def from_hf(cls, cfg: dict, dtype: str = "float32") -> "UMT5Config":
        """Build from a transformers ``config.json`` dict; refuses decoder / unknown activations."""
        if cfg.get("is_decoder", False):
            raise ValueError("config.json has is_decoder=true; ditax implements the UMT5 encoder "
                             "only. Point at an encoder (text_encoder/) checkpoint.")
        names = {f.name for f in dataclasses.fields(cls)} - {"dtype"}
        kw = {k: cfg[k] for k in names if k in cfg}
        out = cls(**kw, dtype=dtype)
        parts = out.feed_forward_proj.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise ValueError(f"feed_forward_proj={out.feed_forward_proj!r} is not of the form "
                             "'gated-ACT' or 'ACT'")
        if out.act_name not in _ACTIVATIONS:
            raise ValueError(f"activation {out.act_name!r} (from feed_forward_proj="
                             f"{out.feed_forward_proj!r}) is not supported; supported: "
                             f"{sorted(_ACTIVATIONS)}")
        _dtype(dtype)
        return out


def relative_position_buckets(q_len: int, k_len: int, num_buckets: int,
                              max_distance: int) -> np.ndarray:
    """Bidirectional T5 bucket of ``key_pos - query_pos``, int32 ``[T_q, T_k]``.

    Half the buckets are for positive offsets; within a half, offsets below ``n/2`` get their
    own bucket and larger ones share log-spaced buckets up to ``max_distance``. Computed on the
    host in float32 like the reference so that boundary offsets land in the same bucket.
    """
    rel = np.arange(k_len)[None, :] - np.arange(q_len)[:, None]
    half = num_buckets // 2
    base = (rel > 0).astype(np.int64) * half
    dist = np.abs(rel)
    max_exact = half // 2
    with np.errstate(divide="ignore"):
        ratio = np.log(dist.astype(np.float32) / np.float32(max_exact))
        ratio = ratio / np.float32(math.log(max_distance / max_exact))
        ratio = ratio * np.float32(half - max_exact)
    large = max_exact + np.where(np.isfinite(ratio), ratio, 0).astype(np.int64)
    large = np.minimum(large, half - 1)
    return (base + np.where(dist < max_exact, dist, large)).astype(np.int32)


class _Dense(nnx.Module):
    """Bias-free linear; ``weight`` is ``[in, out]`` (the transpose of torch's)."""

    def __init__(self, din: int, dout: int, dtype, rngs: nnx.Rngs):
        init = nnx.initializers.normal(stddev=din ** -0.5)
        self.weight = nnx.Param(init(rngs.params(), (din, dout), dtype))

    def __call__(self, x):
        return jnp.einsum("...i,io->...o", x, self.weight[...].astype(x.dtype))


class T5RMSNorm(nnx.Module):
    """``w * x / sqrt(mean(x^2) + eps)``; the mean of squares in float32, result in ``x.dtype``."""

    def __init__(self, dim: int, eps: float, dtype):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        var = jnp.mean(xf * xf, axis=-1, keepdims=True)
        y = (xf * jax.lax.rsqrt(var + self.eps)).astype(x.dtype)
        return self.weight[...].astype(x.dtype) * y


class UMT5SelfAttention(nnx.Module):
    """Unscaled multi-head self-attention with this layer's relative position bias."""

    def __init__(self, cfg: UMT5Config, rngs: nnx.Rngs):
        dt = _dtype(cfg.dtype)
        inner = cfg.num_heads * cfg.d_kv
        self.q = _Dense(cfg.d_model, inner, dt, rngs)
        self.k = _Dense(cfg.d_model, inner, dt, rngs)
        self.v = _Dense(cfg.d_model, inner, dt, rngs)
        self.o = _Dense(inner, cfg.d_model, dt, rngs)
        self.relative_attention_bias = nnx.Param(
            nnx.initializers.normal(1.0)(rngs.params(),
                                         (cfg.relative_attention_num_buckets, cfg.num_heads), dt))
        self.num_heads = cfg.num_heads
        self.d_kv = cfg.d_kv

    def __call__(self, x, buckets, key_mask):
        """x ``[B, T, D]``, buckets int ``[T, T]``, key_mask bool ``[B, T]`` → ``[B, T, D]``."""
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, self.num_heads, self.d_kv)
        k = self.k(x).reshape(b, t, self.num_heads, self.d_kv)
        v = self.v(x).reshape(b, t, self.num_heads, self.d_kv)
        logits = jnp.einsum("bqnk,bsnk->bnqs", q, k).astype(jnp.float32)
        bias = self.relative_attention_bias[...][buckets]  # [T, T, N]
        logits = logits + jnp.transpose(bias, (2, 0, 1)).astype(jnp.float32)[None]
        logits = jnp.where(key_mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(logits, axis=-1).astype(x.dtype)
        out = jnp.einsum("bnqs,bsnk->bqnk", probs, v).reshape(b, t, self.num_heads * self.d_kv)
        return self.o(out)


class UMT5FeedForward(nnx.Module):
    """Gated: ``wo(act(wi_0 x) * wi_1 x)``; plain: ``wo(act(wi x))``. ``[B, T, D] → [B, T, D]``."""

    def __init__(self, cfg: UMT5Config, rngs: nnx.Rngs):
        dt = _dtype(cfg.dtype)
        self.gated = cfg.is_gated
        if self.gated:
            self.wi_0 = _Dense(cfg.d_model, cfg.d_ff, dt, rngs)
            self.wi_1 = _Dense(cfg.d_model, cfg.d_ff, dt, rngs)
        else:
            self.wi = _Dense(cfg.d_model, cfg.d_ff, dt, rngs)
        self.wo = _Dense(cfg.d_ff, cfg.d_model, dt, rngs)
        self.act = _ACTIVATIONS[cfg.act_name]

    def __call__(self, x):
        if self.gated:
            h = self.act(self.wi_0(x)) * self.wi_1(x)
        else:
            h = self.act(self.wi(x))
        return self.wo(h)


class UMT5Block(nnx.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + ffn(norm(x))``."""

    def __init__(self, cfg: UMT5Config, rngs: nnx.Rngs):
        dt = _dtype(cfg.dtype)
        self.attn_norm = T5RMSNorm(cfg.d_model, cfg.layer_norm_epsilon, dt)
        self.attn = UMT5SelfAttention(cfg, rngs)
        self.ffn_norm = T5RMSNorm(cfg.d_model, cfg.layer_norm_epsilon, dt)
        self.ffn = UMT5FeedForward(cfg, rngs)

    def __call__(self, x, buckets, key_mask):
        x = x + self.attn(self.attn_norm(x), buckets, key_mask)
        return x + self.ffn(self.ffn_norm(x))


class UMT5Encoder(nnx.Module):
    """UMT5 encoder: ids ``[B, T]`` + padding mask ``[B, T]`` → hidden states ``[B, T, D]``.

    Padded keys are excluded from attention; padded query positions still get (meaningless)
    outputs, as in the reference — :func:`encode_prompt` zeroes them the way Wan does.
    """

    def __init__(self, cfg: UMT5Config, *, rngs: nnx.Rngs):
        dt = _dtype(cfg.dtype)
        self.cfg = cfg
        self.shared = nnx.Param(nnx.initializers.normal(1.0)(rngs.params(),
                                                             (cfg.vocab_size, cfg.d_model), dt))
        self.blocks = nnx.List([UMT5Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.final_layer_norm = T5RMSNorm(cfg.d_model, cfg.layer_norm_epsilon, dt)

    def __call__(self, input_ids, attention_mask=None):
        input_ids = jnp.asarray(input_ids)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [B, T]; got shape {input_ids.shape}")
        b, t = input_ids.shape
        if attention_mask is None:
            key_mask = jnp.ones((b, t), bool)
        else:
            attention_mask = jnp.asarray(attention_mask)
            if attention_mask.shape != (b, t):
                raise ValueError(f"attention_mask shape {attention_mask.shape} != input_ids "
                                 f"shape {(b, t)}")
            key_mask = attention_mask > 0
        buckets = jnp.asarray(relative_position_buckets(
            t, t, self.cfg.relative_attention_num_buckets,
            self.cfg.relative_attention_max_distance))
        x = jnp.take(self.shared[...], input_ids, axis=0)
        for blk in self.blocks:
            x = blk(x, buckets, key_mask)
        return self.final_layer_norm(x)


# ----------------------------------------------------------------------------- loading

def weight_table(cfg: UMT5Config) -> Table:
    """transformers ``UMT5EncoderModel`` keys ↔ our parameter paths (torch linears transposed).

    The tied input embedding may be stored as ``shared.weight`` or
    ``encoder.embed_tokens.weight``; a full seq2seq checkpoint's ``decoder.*`` and
    ``lm_head.*`` are not read.
    """
    rows = [Row(("shared",), "shared.weight", alt=("encoder.embed_tokens.weight",)),
            Row(("final_layer_norm", "weight"), "encoder.final_layer_norm.weight")]
    ffn = ("wi_0", "wi_1", "wo") if cfg.is_gated else ("wi", "wo")
    for i in range(cfg.num_layers):
        p, b = f"encoder.block.{i}.layer.", ("blocks", str(i))
        rows += [Row(b + ("attn", n, "weight"), f"{p}0.SelfAttention.{n}.weight", TRANSPOSE)
                 for n in "qkvo"]
        rows += [Row(b + ("attn", "relative_attention_bias"),
                     f"{p}0.SelfAttention.relative_attention_bias.weight"),
                 Row(b + ("attn_norm", "weight"), f"{p}0.layer_norm.weight"),
                 Row(b + ("ffn_norm", "weight"), f"{p}1.layer_norm.weight")]
        rows += [Row(b + ("ffn", n, "weight"), f"{p}1.DenseReluDense.{n}.weight", TRANSPOSE)
                 for n in ffn]
    return Table("UMT5 text encoder", tuple(rows), ignore=(r"^decoder\.", r"^lm_head\."),
                 context=f"its config (num_layers={cfg.num_layers}, feed_forward_proj="
                         f"{cfg.feed_forward_proj!r})")


def load_text_encoder(path, dtype="float32") -> UMT5Encoder:
    """Load a transformers ``UMT5EncoderModel`` folder (or a pipeline's ``text_encoder/``).

    Every tensor goes through :func:`weight_table` (key check, shape check, torch ``[out, in]``
    linears transposed) and is cast to ``dtype``; a mismatch raises one
    :class:`~ditax.errors.WeightError` naming the keys or shapes.
    """
    folder = resolve_folder(path, "text_encoder")
    cfg = UMT5Config.from_hf(read_model_json(folder / "config.json", "UMT5 config"), dtype=dtype)
    abstract = nnx.eval_shape(lambda: UMT5Encoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    state = load_params(weight_table(cfg), Weights.open(folder), state, _dtype(dtype))
    return nnx.merge(graphdef, state)


@nnx.jit
def _encode_jit(encoder: UMT5Encoder, ids, mask):
    return encoder(ids, mask)


def encode_prompt(tokenizer, encoder: UMT5Encoder, prompts, max_length: int = 512):
    """Prompts → text embeddings ``[B, max_length, D]`` exactly as Wan's pipeline builds them.

    Prompts are cleaned (:func:`ditax.models.tokenizer.clean_prompt`), tokenized padded and
    truncated to ``max_length`` with the end token, encoded with the padding mask, and every
    position at or past a prompt's token count is set to zero.
    """
    from ditax.models.tokenizer import clean_prompt

    if isinstance(prompts, str):
        prompts = [prompts]
    ids, mask = tokenizer.encode([clean_prompt(p) for p in prompts], max_length)
    hidden = _encode_jit(encoder, jnp.asarray(ids), jnp.asarray(mask))
    lengths = np.asarray(mask).astype(bool).sum(axis=1)
    keep = jnp.arange(max_length)[None, :] < jnp.asarray(lengths)[:, None]
    return jnp.where(keep[..., None], hidden, jnp.zeros((), hidden.dtype))
