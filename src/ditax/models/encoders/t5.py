"""T5-family text encoders in Flax NNX: T5 v1.1 / mT5 (FLUX.1's ``text_encoder_2``, the
t5-v1_1-xxl) and UMT5 (Wan's ``text_encoder``, in :mod:`ditax.models.encoders.umt5`).

Numerically matches transformers' ``T5EncoderModel`` and ``UMT5EncoderModel``. The two differ
in one thing, :attr:`T5Config.per_layer_bias`:

- T5 / mT5: only the first layer owns a relative position bias table ``[buckets, N]``; the
  bias it computes is added to the attention logits of every layer;
- UMT5: every layer owns its table and adds its own bias.

Common to both, and unlike a textbook transformer:

- attention logits are NOT scaled by ``1/sqrt(K)`` (T5 folds that into the initialisation)
  and the softmax runs in float32;
- norms are T5 RMS norms: no mean subtraction, no bias, variance in float32;
- the MLP is gated (``wo(act(wi_0 x) * wi_1 x)``, the tanh GELU for ``gated-gelu``) or plain
  (``wo(act(wi x))``), all linears without bias.

Module names mirror the transformers keys so that :func:`weight_table` is a table.
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

from ditax.errors import ConfigError, check_choice
from ditax.io.convert import TRANSPOSE, Row, Table, load_params
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights
from ditax.models.encoders.inputs import compute_dtype, token_mask
from ditax.nn.activations import ACTIVATIONS
from ditax.nn.offload import on_device

# config.json model_type → whether every layer owns its relative position bias
MODEL_TYPES = {"t5": False, "mt5": False, "umt5": True}


def _dtype(d):
    """``jnp.dtype(d)``, refusing anything that is not a floating-point type."""
    return compute_dtype(d, "float32, bfloat16 or float16")


@dataclass(frozen=True)
class T5Config:
    """Encoder shape, with transformers' ``T5Config`` field names; the defaults are
    google/t5-v1_1-xxl (FLUX.1's ``text_encoder_2``). ``per_layer_bias``: UMT5's relative
    bias in every layer instead of T5's one shared from the first; ``dtype``: storage and
    compute dtype (norm statistics and softmax stay float32)."""

    vocab_size: int = 32128
    d_model: int = 4096
    d_kv: int = 64
    d_ff: int = 10240
    num_layers: int = 24
    num_heads: int = 64
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "gated-gelu"
    per_layer_bias: bool = False
    dtype: str = "float32"

    @property
    def name(self) -> str:
        return "UMT5" if self.per_layer_bias else "T5"

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
    def from_hf(cls, cfg: dict, dtype: str = "float32") -> "T5Config":
        """Build from a transformers ``config.json`` dict. Refuses a decoder, an unknown
        activation, and a ``model_type`` of the other variant than this class's (a UMT5
        folder given to the T5 loader, or the reverse), naming the loader to use."""
        if cfg.get("is_decoder", False):
            raise ConfigError("config.json has is_decoder=true; ditax implements the T5 / UMT5 "
                              "encoder only. Point at an encoder (text_encoder/) checkpoint.")
        names = {f.name for f in dataclasses.fields(cls)} - {"dtype", "per_layer_bias"}
        out = cls(**{k: cfg[k] for k in names if k in cfg}, dtype=dtype)
        model_type = cfg.get("model_type")
        if model_type is not None:
            check_choice("config.json model_type", model_type, tuple(MODEL_TYPES))
            if MODEL_TYPES[model_type] != out.per_layer_bias:
                other = ("ditax.models.encoders.umt5.load_text_encoder" if MODEL_TYPES[model_type]
                         else "ditax.models.encoders.t5.load_t5_encoder")
                raise ConfigError(f"config.json has model_type={model_type!r}, not a "
                                  f"{out.name} encoder; load it with {other}")
        out.check()
        return out

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the value the encoder cannot be built with."""
        parts = self.feed_forward_proj.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise ConfigError(f"feed_forward_proj={self.feed_forward_proj!r} is not of the "
                              "form 'gated-ACT' or 'ACT'")
        if self.act_name not in ACTIVATIONS:
            raise ConfigError(f"activation {self.act_name!r} (from feed_forward_proj="
                              f"{self.feed_forward_proj!r}) is not supported; supported: "
                              f"{sorted(ACTIVATIONS)}")
        _dtype(self.dtype)


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
    """Bias-free linear; ``weight`` is ``[in, out]`` (the transpose of torch's). Loaded with
    ``quantize=`` (:func:`load_encoder`): ``weight`` 8-bit and ``kernel_scale`` ``[out]``
    float32 (per output channel, :mod:`ditax.nn.quant`'s scales), ``y = (x @ q) * scale``."""

    def __init__(self, din: int, dout: int, dtype, rngs: nnx.Rngs):
        init = nnx.initializers.normal(stddev=din ** -0.5)
        self.weight = nnx.Param(init(rngs.params(), (din, dout), dtype))

    def __call__(self, x):
        y = jnp.einsum("...i,io->...o", x, self.weight[...].astype(x.dtype))
        scale = getattr(self, "kernel_scale", None)     # set on 8-bit loading only
        return y if scale is None else y * scale[...].astype(x.dtype)

    def make_8bit(self, mode: str) -> None:
        """Abstract 8-bit ``weight`` and ``kernel_scale`` in place (the loader fills them)."""
        from ditax.nn.quant import STORED

        din, dout = self.weight.shape
        self.weight = nnx.Param(jax.ShapeDtypeStruct((din, dout), STORED[mode]))
        self.kernel_scale = nnx.Param(jax.ShapeDtypeStruct((dout,), jnp.float32))


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


class T5SelfAttention(nnx.Module):
    """Unscaled multi-head self-attention plus a relative position bias; ``has_bias``: this
    layer owns a bias table (every UMT5 layer, T5's first)."""

    def __init__(self, cfg: T5Config, rngs: nnx.Rngs, has_bias: bool):
        dt = _dtype(cfg.dtype)
        inner = cfg.num_heads * cfg.d_kv
        self.q = _Dense(cfg.d_model, inner, dt, rngs)
        self.k = _Dense(cfg.d_model, inner, dt, rngs)
        self.v = _Dense(cfg.d_model, inner, dt, rngs)
        self.o = _Dense(inner, cfg.d_model, dt, rngs)
        self.relative_attention_bias = nnx.Param(
            nnx.initializers.normal(1.0)(rngs.params(),
                                         (cfg.relative_attention_num_buckets, cfg.num_heads),
                                         dt)) if has_bias else None
        self.num_heads = cfg.num_heads
        self.d_kv = cfg.d_kv

    @property
    def has_bias(self) -> bool:
        return self.relative_attention_bias is not None

    def position_bias(self, buckets):
        """buckets int ``[T, T]`` → this layer's bias, float32 ``[N, T, T]``."""
        bias = self.relative_attention_bias[...][buckets]  # [T, T, N]
        return jnp.transpose(bias, (2, 0, 1)).astype(jnp.float32)

    def __call__(self, x, bias, key_mask):
        """x ``[B, T, D]``, bias float32 ``[N, T, T]``, key_mask bool ``[B, T]`` → ``[B, T, D]``."""
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, self.num_heads, self.d_kv)
        k = self.k(x).reshape(b, t, self.num_heads, self.d_kv)
        v = self.v(x).reshape(b, t, self.num_heads, self.d_kv)
        logits = jnp.einsum("bqnk,bsnk->bnqs", q, k).astype(jnp.float32)
        logits = logits + bias[None]
        logits = jnp.where(key_mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(logits, axis=-1).astype(x.dtype)
        out = jnp.einsum("bnqs,bsnk->bqnk", probs, v).reshape(b, t, self.num_heads * self.d_kv)
        return self.o(out)


class T5FeedForward(nnx.Module):
    """Gated: ``wo(act(wi_0 x) * wi_1 x)``; plain: ``wo(act(wi x))``. ``[B, T, D] → [B, T, D]``."""

    def __init__(self, cfg: T5Config, rngs: nnx.Rngs):
        dt = _dtype(cfg.dtype)
        self.gated = cfg.is_gated
        if self.gated:
            self.wi_0 = _Dense(cfg.d_model, cfg.d_ff, dt, rngs)
            self.wi_1 = _Dense(cfg.d_model, cfg.d_ff, dt, rngs)
        else:
            self.wi = _Dense(cfg.d_model, cfg.d_ff, dt, rngs)
        self.wo = _Dense(cfg.d_ff, cfg.d_model, dt, rngs)
        self.act = ACTIVATIONS[cfg.act_name]

    def __call__(self, x):
        if self.gated:
            h = self.act(self.wi_0(x)) * self.wi_1(x)
        else:
            h = self.act(self.wi(x))
        return self.wo(h)


class T5Block(nnx.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + ffn(norm(x))``."""

    def __init__(self, cfg: T5Config, rngs: nnx.Rngs, has_bias: bool):
        dt = _dtype(cfg.dtype)
        self.attn_norm = T5RMSNorm(cfg.d_model, cfg.layer_norm_epsilon, dt)
        self.attn = T5SelfAttention(cfg, rngs, has_bias)
        self.ffn_norm = T5RMSNorm(cfg.d_model, cfg.layer_norm_epsilon, dt)
        self.ffn = T5FeedForward(cfg, rngs)

    def __call__(self, x, bias, key_mask):
        x = x + self.attn(self.attn_norm(x), bias, key_mask)
        return x + self.ffn(self.ffn_norm(x))


class T5Encoder(nnx.Module):
    """T5 / UMT5 encoder: ids ``[B, T]`` + padding mask ``[B, T]`` → hidden states ``[B, T, D]``.

    Padded keys are excluded from attention; padded query positions still get (meaningless)
    outputs, as in the reference. Without a mask every token is attended (FLUX.1 runs its T5
    that way, padding included).
    """

    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs):
        cfg.check()
        dt = _dtype(cfg.dtype)
        self.cfg = cfg
        self.shared = nnx.Param(nnx.initializers.normal(1.0)(rngs.params(),
                                                             (cfg.vocab_size, cfg.d_model), dt))
        self.blocks = nnx.List([T5Block(cfg, rngs, has_bias=cfg.per_layer_bias or i == 0)
                                for i in range(cfg.num_layers)])
        self.final_layer_norm = T5RMSNorm(cfg.d_model, cfg.layer_norm_epsilon, dt)

    @on_device     # weights kept in host memory (text_offload): on the device for the call
    def __call__(self, input_ids, attention_mask=None):
        input_ids = jnp.asarray(input_ids)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [B, T]; got shape {input_ids.shape}")
        b, t = input_ids.shape
        key_mask = token_mask(input_ids, attention_mask)
        buckets = jnp.asarray(relative_position_buckets(
            t, t, self.cfg.relative_attention_num_buckets,
            self.cfg.relative_attention_max_distance))
        x = jnp.take(self.shared[...], input_ids, axis=0)
        bias = None
        for blk in self.blocks:
            if blk.attn.has_bias:          # every UMT5 layer; T5's first, shared by the rest
                bias = blk.attn.position_bias(buckets)
            x = blk(x, bias, key_mask)
        return self.final_layer_norm(x)


# ----------------------------------------------------------------------------- loading

def weight_table(cfg: T5Config) -> Table:
    """transformers ``T5EncoderModel`` / ``UMT5EncoderModel`` keys ↔ our parameter paths
    (torch linears transposed); the bias table of every layer (UMT5) or of layer 0 (T5).

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
        if cfg.per_layer_bias or i == 0:
            rows.append(Row(b + ("attn", "relative_attention_bias"),
                            f"{p}0.SelfAttention.relative_attention_bias.weight"))
        rows += [Row(b + ("attn_norm", "weight"), f"{p}0.layer_norm.weight"),
                 Row(b + ("ffn_norm", "weight"), f"{p}1.layer_norm.weight")]
        rows += [Row(b + ("ffn", n, "weight"), f"{p}1.DenseReluDense.{n}.weight", TRANSPOSE)
                 for n in ffn]
    return Table(f"{cfg.name} text encoder", tuple(rows), ignore=(r"^decoder\.", r"^lm_head\."),
                 context=f"its config (num_layers={cfg.num_layers}, feed_forward_proj="
                         f"{cfg.feed_forward_proj!r})")


def load_encoder(path, dtype="float32", *, config_class=T5Config, module_class=T5Encoder,
                 subfolder: str = "text_encoder_2", quantize: str = "none"):
    """Load a transformers encoder folder (or a pipeline folder's ``subfolder/``) into
    ``module_class`` built from ``config_class.from_hf(config.json)``.

    Every tensor goes through :func:`weight_table` (key check, shape check, torch ``[out, in]``
    linears transposed; sharded ``model.safetensors.index.json`` folders too) and is cast to
    ``dtype``; a mismatch raises one :class:`~ditax.errors.WeightError` naming the keys or
    shapes. ``quantize`` (``int8`` | ``fp8``): every block linear stored in 8 bits with
    per-output-channel scales, quantized as each tensor is read (the float encoder is never
    whole in memory); the embedding, norms and position biases stay in ``dtype``.
    """
    from ditax.nn import quant

    if quantize not in quant.MODES:
        raise ConfigError(f"text_quantize={quantize!r} is not a quantization mode; use one of "
                          f"{', '.join(quant.MODES)}")
    folder = resolve_folder(path, subfolder)
    raw = read_model_json(folder / "config.json", f"{config_class.__name__} config")
    cfg = config_class.from_hf(raw, dtype=dtype)
    abstract = nnx.eval_shape(lambda: module_class(cfg, rngs=nnx.Rngs(0)))
    quantizers = {}
    if quantize != "none":
        for path_, module in nnx.iter_modules(abstract):
            if isinstance(module, _Dense):
                module.make_8bit(quantize)
                quantizers[tuple(str(p) for p in path_) + ("weight",)] = quant.reader(quantize)
    graphdef, state = nnx.split(abstract)
    state = load_params(weight_table(cfg), Weights.open(folder), state, _dtype(dtype),
                        quantize=quantizers)
    return nnx.merge(graphdef, state)


def load_t5_encoder(path, dtype="float32", quantize: str = "none") -> T5Encoder:
    """Load a transformers ``T5EncoderModel`` folder (t5-v1_1-xxl) or a FLUX.1 pipeline
    folder's ``text_encoder_2/``; see :func:`load_encoder` for the checks and ``quantize``."""
    return load_encoder(path, dtype, subfolder="text_encoder_2", quantize=quantize)


def load_t5(path, dtype="float32", quantize: str = "none"):
    """A FLUX.1 pipeline folder → ``(T5Encoder, Tokenizer)`` from its ``text_encoder_2/`` and
    ``tokenizer_2/`` (:func:`ditax.models.encoders.tokenizer.load_t5_tokenizer`)."""
    from ditax.models.encoders.tokenizer import load_t5_tokenizer

    return load_t5_encoder(path, dtype, quantize), load_t5_tokenizer(path)


@nnx.jit
def _encode_unmasked(encoder: T5Encoder, ids):
    return encoder(ids)


def encode_t5_prompt(tokenizer, encoder: T5Encoder, prompts, max_length: int = 512):
    """Prompts → T5 embeddings ``[B, max_length, D]`` as FLUX.1's pipeline builds them
    (``FluxPipeline._get_t5_prompt_embeds``): tokenized with the end token, padded and
    truncated to ``max_length``, and encoded WITHOUT the padding mask (every token, padding
    included, is attended; nothing is zeroed)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    ids, _ = tokenizer.encode(list(prompts), max_length)
    return _encode_unmasked(encoder, jnp.asarray(ids))


__all__ = ["T5Config", "T5Encoder", "MODEL_TYPES", "relative_position_buckets", "weight_table",
           "load_encoder", "load_t5_encoder", "load_t5", "encode_t5_prompt"]
