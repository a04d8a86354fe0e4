"""CLIP text encoder weights (transformers format) ↔ :class:`CLIPTextEncoder`; FLUX.1's pooled
prompt vector.

Checkpoints name the text tower ``text_model.*`` (``CLIPTextModel`` of transformers 4, FLUX.1's
``text_encoder/``, a full ``CLIPModel``) or without that prefix; both are read. A full CLIP
model's vision tower and projection heads, and the old ``position_ids`` buffer, are not read.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.io.convert import Table, load_params
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights
from ditax.models.encoders.clip.loading import layer_rows, tower_row
from ditax.models.encoders.clip.text import CLIPTextConfig, CLIPTextEncoder

_PREFIX = "text_model."

IGNORED = (r"^vision_model\.", r"^visual_projection\.", r"^text_projection\.", r"^logit_scale$",
           r"(^|\.)embeddings\.position_ids$")


def text_weight_table(cfg: CLIPTextConfig) -> Table:
    """transformers ``CLIPTextModel`` keys ↔ our parameter paths (linears transposed, layers
    stacked on a leading axis; the layer rows are the vision tower's)."""
    rows = [tower_row(("embeddings", n), f"embeddings.{n}.weight", prefix=_PREFIX)
            for n in ("token_embedding", "position_embedding")]
    rows += [tower_row(("final_layer_norm", "scale"), "final_layer_norm.weight", prefix=_PREFIX),
             tower_row(("final_layer_norm", "bias"), "final_layer_norm.bias", prefix=_PREFIX)]
    rows += layer_rows(_PREFIX)
    return Table("CLIP text encoder", tuple(rows), cfg.num_hidden_layers, IGNORED,
                 f"its config (num_hidden_layers={cfg.num_hidden_layers}, hidden_size="
                 f"{cfg.hidden_size}, vocab_size={cfg.vocab_size}, max_position_embeddings="
                 f"{cfg.max_position_embeddings})")


def load_clip_text_encoder(path, dtype="float32") -> CLIPTextEncoder:
    """Load a transformers ``CLIPTextModel`` folder (or a pipeline folder's ``text_encoder/``,
    or a hub id).

    Every tensor goes through :func:`text_weight_table` (key and shape checks, sharded
    folders too) and is cast to ``dtype``; a mismatch raises one
    :class:`~ditax.errors.WeightError` naming the keys.
    """
    folder = resolve_folder(path, "text_encoder")
    cfg = CLIPTextConfig.from_hf(read_model_json(folder / "config.json", "CLIP text config"),
                                 dtype)
    abstract = nnx.eval_shape(lambda: CLIPTextEncoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    state = load_params(text_weight_table(cfg), Weights.open(folder), state, jnp.dtype(dtype))
    return nnx.merge(graphdef, state)


def load_clip_text(path, dtype="float32"):
    """A FLUX.1 pipeline folder → ``(CLIPTextEncoder, Tokenizer)`` from its ``text_encoder/``
    and ``tokenizer/`` (:func:`ditax.models.encoders.tokenizer.load_clip_tokenizer`)."""
    from ditax.models.encoders.tokenizer import load_clip_tokenizer

    return load_clip_text_encoder(path, dtype), load_clip_tokenizer(path)


@nnx.jit
def _pooled_jit(encoder: CLIPTextEncoder, ids):
    return encoder.pooled(ids)


def encode_clip_pooled(tokenizer, encoder: CLIPTextEncoder, prompts,
                       max_length: int | None = None) -> jax.Array:
    """Prompts → pooled CLIP vectors ``[B, D]`` as FLUX.1's pipeline builds them
    (``FluxPipeline._get_clip_prompt_embeds``): tokenized with the start and end tokens,
    padded and truncated to ``max_length`` (default: the tokenizer's ``model_max_length``,
    else the encoder's ``max_position_embeddings``, 77), encoded without a padding mask, the
    ``pooler_output`` taken."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if max_length is None:
        max_length = tokenizer.model_max_length or encoder.cfg.max_position_embeddings
    ids, _ = tokenizer.encode(list(prompts), max_length)
    return _pooled_jit(encoder, jnp.asarray(ids))


__all__ = ["text_weight_table", "load_clip_text_encoder", "load_clip_text", "encode_clip_pooled"]
