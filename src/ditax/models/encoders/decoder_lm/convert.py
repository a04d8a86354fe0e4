"""The decoder LMs' weight table (transformers keys ↔ our parameter paths) and the one
loader every decoder-LM family uses.

A transformers checkpoint names the text stack under a prefix that depends on the class that
saved it: ``language_model.model.`` (a multimodal ``*ForConditionalGeneration`` as
transformers writes it), ``model.language_model.`` (the same class's in-memory names),
``model.`` (``*ForCausalLM``) or nothing (the bare text model). :func:`text_prefix` finds it
from the embedding key; everything else under another prefix (a vision tower, a projector, the
LM head) is in the family's ``ignore`` list and never read.
"""

from __future__ import annotations

import types

from flax import nnx

from ditax.errors import ConfigError, WeightError
from ditax.io.convert import TRANSPOSE, Row, Table, listing, load_params
from ditax.models.encoders.decoder_lm.config import DecoderLMConfig, compute_dtype
from ditax.nn import quant

PREFIXES = ("language_model.model.", "model.language_model.", "model.", "")
EMBED = "embed_tokens.weight"


def text_prefix(keys, source="the checkpoint", prefixes=PREFIXES) -> str:
    """The prefix under which ``keys`` hold the text stack (the first of ``prefixes`` whose
    embedding is there); a :class:`WeightError` naming what was looked for otherwise."""
    have = set(keys)
    for p in prefixes:
        if p + EMBED in have:
            return p
    wanted = listing([p + EMBED for p in prefixes])
    raise WeightError(f"{source} holds no text-model embedding ({wanted}); point at a "
                      f"transformers text encoder folder (a pipeline's text_encoder/)")


def weight_table(cfg: DecoderLMConfig, prefix: str = "", ignore=()) -> Table:
    """transformers keys under ``prefix`` ↔ our paths, one stacked row per layer tensor
    (torch ``[out, in]`` linears transposed), with the logical axes parameters shard by.
    Without ``sandwich_norm`` the upstream ``post_attention_layernorm`` is the pre-MLP norm
    (Llama / Qwen / Mistral naming)."""
    lp = prefix + "layers.{i}."
    rows = [Row(("embed_tokens",), prefix + EMBED, axes=("vocab", "embed")),
            Row(("norm", "weight"), prefix + "norm.weight", axes=("norm",))]
    heads = {"q_proj": ("embed", "heads"), "k_proj": ("embed", "heads"),
             "v_proj": ("embed", "heads"), "o_proj": ("heads", "embed")}
    for name, axes in heads.items():
        rows.append(Row(("layers", "self_attn", name, "kernel"), f"{lp}self_attn.{name}.weight",
                        TRANSPOSE, axes=axes))
        if cfg.attention_bias:
            rows.append(Row(("layers", "self_attn", name, "bias"), f"{lp}self_attn.{name}.bias",
                            axes=axes[-1:]))
    if cfg.qk_norm:
        rows += [Row(("layers", "self_attn", n, "weight"), f"{lp}self_attn.{n}.weight",
                     axes=("norm",)) for n in ("q_norm", "k_norm")]
    mlp = {"gate_proj": ("embed", "mlp"), "up_proj": ("embed", "mlp"),
           "down_proj": ("mlp", "embed")}
    rows += [Row(("layers", "mlp", n, "kernel"), f"{lp}mlp.{n}.weight", TRANSPOSE, axes=a)
             for n, a in mlp.items()]
    norms = ({n: n for n in ("input_layernorm", "post_attention_layernorm",
                             "pre_feedforward_layernorm", "post_feedforward_layernorm")}
             if cfg.sandwich_norm else
             {"input_layernorm": "input_layernorm",
              "pre_feedforward_layernorm": "post_attention_layernorm"})
    rows += [Row(("layers", ours, "weight"), f"{lp}{theirs}.weight", axes=("norm",))
             for ours, theirs in norms.items()]
    return Table(f"{cfg.name} text encoder", tuple(rows), layers=cfg.num_layers,
                 ignore=tuple(ignore),
                 context=f"its config (num_hidden_layers={cfg.num_layers}, hidden_size="
                         f"{cfg.hidden_size}, {cfg.num_heads} heads / {cfg.num_kv_heads} "
                         f"key-value heads of {cfg.head_dim})")


def load_decoder_lm(cfg: DecoderLMConfig, weights, source, *, ignore=(), quantize="none",
                    quantize_activations: bool = False, mesh=None):
    """A :class:`~ditax.models.encoders.decoder_lm.model.DecoderLM` of ``cfg`` filled from
    ``weights`` (a :class:`ditax.io.weights.Weights`; ``source`` names it in messages).

    Keys and shapes are checked first (one :class:`WeightError` listing every missing,
    unexpected or misshapen tensor); ``ignore``: regexes of keys that may be present and are
    not read. ``quantize`` (``none`` | ``int8`` | ``fp8``): the block linears stored in 8 bits
    with per-output-channel scales, quantized as each tensor is read (:mod:`ditax.nn.quant`,
    as the transformers' ``quantize=``); embeddings and norms stay in ``cfg.dtype``.
    ``mesh``: parameters read straight into shardings by their logical axes
    (:data:`ditax.parallel.rules.PARAM_RULES`); None: plain arrays.
    """
    from ditax.models.encoders.decoder_lm.model import DecoderLM

    if quantize not in quant.MODES:
        raise ConfigError(f"quantize={quantize!r} is not a quantization mode; use one of "
                          f"{', '.join(quant.MODES)}")
    if quantize_activations and quantize == "none":
        raise ConfigError("quantize_activations=True needs 8-bit weights: pass quantize='int8' "
                          "or quantize='fp8'")
    table = weight_table(cfg, text_prefix(weights.keys(), source), ignore)
    abstract = nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0)))
    mode = types.SimpleNamespace(quantize=quantize, quantize_activations=quantize_activations)
    quantizers = quant.prepare(abstract, mode, weights, source, mesh)   # {} unquantized
    graphdef, state = nnx.split(abstract)
    sharding = None
    if mesh is not None:
        from ditax.io.convert import logical_axes
        from ditax.models.common.loaded import param_sharding

        sharding = param_sharding(quant.with_scale_axes(logical_axes(table.rows)), mesh)
    state = load_params(table, weights, state, compute_dtype(cfg.dtype), sharding, quantizers)
    return nnx.merge(graphdef, state)


__all__ = ["PREFIXES", "text_prefix", "weight_table", "load_decoder_lm"]
