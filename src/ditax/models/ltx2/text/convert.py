"""LTX-2's text connectors from a pipeline's ``connectors/`` folder: diffusers keys ↔ our
parameter paths, and the loader.

Our paths mirror diffusers' except where a torch container has no NNX counterpart:
``attn1.to_out.0`` → ``attn1.to_out``, ``ff.net.0.proj`` → ``ff.proj_in``, ``ff.net.2`` →
``ff.proj_out``, and the norm gains ``attn1.norm_q.weight`` → ``attn1.norm_q``.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ditax.io.convert import TRANSPOSE, Row, Table, load_params
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights
from ditax.models.ltx2.text.connectors import LTX2TextConnectors
from ditax.models.ltx2.text.config import LTX2ConnectorsConfig


def _linear(ours: tuple, theirs: str, bias: bool = True) -> list[Row]:
    rows = [Row(ours + ("kernel",), theirs + ".weight", TRANSPOSE)]
    return rows + ([Row(ours + ("bias",), theirs + ".bias")] if bias else [])


def weight_table(cfg: LTX2ConnectorsConfig) -> Table:
    """Every tensor of ``LTX2TextConnectors`` for ``cfg`` (torch linears transposed)."""
    if cfg.per_modality_projections:
        rows = (_linear(("video_text_proj_in",), "video_text_proj_in", cfg.proj_bias)
                + _linear(("audio_text_proj_in",), "audio_text_proj_in", cfg.proj_bias))
    else:
        rows = _linear(("text_proj_in",), "text_proj_in", cfg.proj_bias)
    for name, s in (("video_connector", cfg.video), ("audio_connector", cfg.audio)):
        if s.registers:
            rows.append(Row((name, "learnable_registers"), f"{name}.learnable_registers"))
        for i in range(s.layers):
            ours, theirs = (name, "transformer_blocks", str(i)), f"{name}.transformer_blocks.{i}."
            a, at = ours + ("attn1",), theirs + "attn1."
            for n in ("to_q", "to_k", "to_v"):
                rows += _linear(a + (n,), at + n)
            rows += _linear(a + ("to_out",), at + "to_out.0")
            rows += [Row(a + (n,), f"{at}{n}.weight") for n in ("norm_q", "norm_k")]
            if s.gated:
                rows += _linear(a + ("to_gate_logits",), at + "to_gate_logits")
            rows += (_linear(ours + ("ff", "proj_in"), theirs + "ff.net.0.proj")
                     + _linear(ours + ("ff", "proj_out"), theirs + "ff.net.2"))
    return Table("LTX-2 text connectors", tuple(rows),
                 context=f"its config (per_modality_projections={cfg.per_modality_projections}, "
                         f"{cfg.video.layers} video / {cfg.audio.layers} audio layers)")


def load_connectors(path, dtype: str = "float32", subfolder: str = "connectors", *,
                    loras=None) -> LTX2TextConnectors:
    """Load ``LTX2TextConnectors`` from its folder or a pipeline folder's ``subfolder/``
    (``config.json`` + ``diffusion_pytorch_model.safetensors``), cast to ``dtype``. Keys and
    shapes are checked first: one :class:`~ditax.errors.WeightError` names every mismatch.
    ``loras``: ``[(Lora, strength)]`` in :data:`~ditax.models.ltx2.lora_names.CONNECTOR_NAMES`
    (:func:`~ditax.models.ltx2.lora_names.connector_lora`), merged into the weights as they
    are read (each checked to fit first)."""
    from ditax.io.convert import param_shapes
    from ditax.lora import merged_weights
    from ditax.models.ltx2.lora_names import CONNECTOR_NAMES

    folder = resolve_folder(path, subfolder)
    raw = read_model_json(folder / "config.json", "LTX-2 connectors config")
    cfg = LTX2ConnectorsConfig.from_diffusers(raw, dtype)
    abstract = nnx.eval_shape(lambda: LTX2TextConnectors(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    table, weights = weight_table(cfg), Weights.open(folder)
    if loras:
        weights = merged_weights(weights, loras, table, param_shapes(state),
                                 names=CONNECTOR_NAMES)
    state = load_params(table, weights, state, jnp.dtype(cfg.dtype))
    return nnx.merge(graphdef, state)


__all__ = ["weight_table", "load_connectors"]
