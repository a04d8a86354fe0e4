"""diffusers ``LTX2VideoTransformer3DModel`` weights ↔ ditax parameters: one table.

Each row: our parameter path, the diffusers key (``{i}`` = block index of the stacked row),
the explicit transform, and the logical axes used for sharding (``embed`` over fsdp /
context, ``heads`` / ``mlp`` over tensor — audio heads and audio MLP columns too). The same
table drives loading (key and shape checks, sharded reads: :mod:`ditax.io.convert`) and the
parameter PartitionSpecs (:func:`param_axes`).
"""

from __future__ import annotations

from ditax.io.convert import ID, TRANSPOSE, Row, Table, logical_axes
from ditax.models.ltx2.config import LTX2Config

BLOCKS = "transformer_blocks"


def _linear(path, key, axes_in, axes_out, bias: bool = True):
    rows = [Row(path + ("kernel",), key + ".weight", TRANSPOSE, (axes_in, axes_out))]
    if bias:
        rows.append(Row(path + ("bias",), key + ".bias", ID, (axes_out,)))
    return rows


def _attention(name: str, gated: bool, cfg: LTX2Config) -> list[Row]:
    path, key = (BLOCKS, name), f"{BLOCKS}.{{i}}.{name}"
    rows = []
    for p in ("to_q", "to_k", "to_v"):
        rows += _linear(path + (p,), f"{key}.{p}", "embed", "heads", cfg.attention_bias)
    for p in ("norm_q", "norm_k"):
        rows.append(Row(path + (p, "scale"), f"{key}.{p}.weight", ID, ("norm",)))
    rows += _linear(path + ("to_out",), f"{key}.to_out.0", "heads", "embed",
                    cfg.attention_out_bias)
    if gated:
        rows += _linear(path + ("to_gate_logits",), f"{key}.to_gate_logits", "embed", None)
    return rows


def _block_rows(cfg: LTX2Config) -> list[Row]:
    rows = []
    for name, gated in (("attn1", cfg.gated_attn), ("audio_attn1", cfg.audio_gated_attn),
                        ("attn2", cfg.gated_attn), ("audio_attn2", cfg.audio_gated_attn),
                        ("audio_to_video_attn", cfg.gated_attn),
                        ("video_to_audio_attn", cfg.audio_gated_attn)):
        rows += _attention(name, gated, cfg)
    for ff, bias in (("ff", cfg.ff_bias), ("audio_ff", cfg.audio_ff_bias)):
        rows += _linear((BLOCKS, ff, "proj_in"), f"{BLOCKS}.{{i}}.{ff}.net.0.proj", "embed",
                        "mlp", bias)
        rows += _linear((BLOCKS, ff, "proj_out"), f"{BLOCKS}.{{i}}.{ff}.net.2", "mlp", "embed",
                        bias)
    tables = ["scale_shift_table", "audio_scale_shift_table",
              "video_a2v_cross_attn_scale_shift_table",
              "audio_a2v_cross_attn_scale_shift_table"]
    if cfg.prompt_modulation:
        tables += ["prompt_scale_shift_table", "audio_prompt_scale_shift_table"]
    rows += [Row((BLOCKS, t), f"{BLOCKS}.{{i}}.{t}", ID, ("modulation", "embed"))
             for t in tables]
    if cfg.norm_elementwise_affine:
        for n in ("norm1", "audio_norm1", "norm2", "audio_norm2", "audio_to_video_norm",
                  "video_to_audio_norm", "norm3", "audio_norm3"):
            rows.append(Row((BLOCKS, n, "weight"), f"{BLOCKS}.{{i}}.{n}.weight", ID, ("norm",)))
    return rows


def _adaln(name: str) -> list[Row]:
    """An ``LTX2AdaLayerNormSingle``: its timestep MLP and its modulation projection."""
    emb = (name, "emb", "timestep_embedder")
    key = f"{name}.emb.timestep_embedder"
    return (_linear(emb + ("linear_1",), f"{key}.linear_1", "freq", "embed")
            + _linear(emb + ("linear_2",), f"{key}.linear_2", "embed", None)
            + _linear((name, "linear"), f"{name}.linear", "embed", None))


def table(cfg: LTX2Config) -> list[Row]:
    """The rows (our path, diffusers key, transform, logical axes) of ``cfg``'s model."""
    rows = _linear(("proj_in",), "proj_in", "in_channels", "embed")
    rows += _linear(("audio_proj_in",), "audio_proj_in", "in_channels", "embed")
    if cfg.use_keyframes_abs_pos_embedding:
        rows.append(Row(("keyframes_abs_pos_embedding",), "keyframes_abs_pos_embedding", ID,
                        (None, "embed")))
    if cfg.use_prompt_embeddings:
        for p in ("caption_projection", "audio_caption_projection"):
            rows += _linear((p, "linear_1"), f"{p}.linear_1", "text_embed", "embed")
            rows += _linear((p, "linear_2"), f"{p}.linear_2", "embed", None)
    names = ["time_embed", "audio_time_embed", "av_cross_attn_video_scale_shift",
             "av_cross_attn_audio_scale_shift", "av_cross_attn_video_a2v_gate",
             "av_cross_attn_audio_v2a_gate"]
    if cfg.prompt_adaln:
        names += ["prompt_adaln", "audio_prompt_adaln"]
    for n in names:
        rows += _adaln(n)
    rows += [Row((t,), t, ID, ("modulation", "embed"))
             for t in ("scale_shift_table", "audio_scale_shift_table")]
    rows += _block_rows(cfg)
    rows += _linear(("proj_out",), "proj_out", "embed", "out_channels")
    rows += _linear(("audio_proj_out",), "audio_proj_out", "embed", "out_channels")
    return rows


def weight_table(cfg: LTX2Config) -> Table:
    """The transformer's :class:`~ditax.io.convert.Table` for ``cfg``."""
    flags = ", ".join(f"{k}={getattr(cfg, k)}" for k in (
        "num_layers", "gated_attn", "audio_gated_attn", "cross_attn_mod", "audio_cross_attn_mod",
        "use_prompt_embeddings", "use_prompt_adaln_single", "ff_bias", "audio_ff_bias",
        "use_keyframes_abs_pos_embedding"))
    return Table("transformer", tuple(table(cfg)), cfg.num_layers, (), f"the config ({flags})")


def param_axes(cfg: LTX2Config) -> dict[tuple[str, ...], tuple]:
    """Our parameter path → logical axis names (stacked blocks: a leading "layers")."""
    return logical_axes(table(cfg))


__all__ = ["table", "weight_table", "param_axes"]
