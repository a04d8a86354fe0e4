"""diffusers ``WanAnimateTransformer3DModel`` weights ↔ ditax parameters: Wan's table
(:mod:`.convert`, with the image embedder) plus the Animate rows, and its builders.

The face and motion encoders are small and replicated (no logical axes); the face adapters
are one stack of ``num_layers / inject_face_latents_blocks`` layers.
"""

from __future__ import annotations

from ditax.io.convert import CONV2D, CONV3D, ID, Row, Transform
from ditax.models.wan import convert
from ditax.models.wan.animate import WanAnimateTransformer
from ditax.models.wan.convert import linear

CONV1D = Transform("conv1d", (2, 1, 0))       # Conv1d [O, I, k] -> [k, I, O]


def _motion_conv(path, key, act: bool = True) -> list[Row]:
    rows = [Row(path + ("kernel",), key + ".weight", CONV2D, (None,) * 4)]
    if act:
        rows.append(Row(path + ("act_bias",), key + ".act_fn.bias", ID, (None,)))
    return rows


def motion_rows(cfg) -> list[Row]:
    """The motion encoder's rows."""
    p, k = ("motion_encoder",), "motion_encoder"
    rows = _motion_conv(p + ("conv_in",), k + ".conv_in")
    for j in range(int(cfg.motion_encoder_size).bit_length() - 3):
        rp, rk = p + (f"res_{j}",), f"{k}.res_blocks.{j}"
        rows += _motion_conv(rp + ("conv1",), rk + ".conv1")
        rows += _motion_conv(rp + ("conv2",), rk + ".conv2")
        rows += _motion_conv(rp + ("conv_skip",), rk + ".conv_skip", act=False)
    rows += _motion_conv(p + ("conv_out",), k + ".conv_out", act=False)
    for j in range(cfg.motion_blocks):
        rows += [Row(p + (f"linear_{j}", "weight"), f"{k}.motion_network.{j}.weight", ID,
                     (None, None)),
                 Row(p + (f"linear_{j}", "bias"), f"{k}.motion_network.{j}.bias", ID, (None,))]
    rows.append(Row(p + ("motion_synthesis_weight",), k + ".motion_synthesis_weight", ID,
                    (None, None)))
    return rows


def face_rows(cfg) -> list[Row]:
    """The face encoder's and the face adapters' rows."""
    rows = []
    for n in ("conv1", "conv2", "conv3"):
        key = "face_encoder." + ("conv1_local" if n == "conv1" else n)
        rows += [Row(("face_encoder", f"{n}_kernel"), key + ".weight", CONV1D, (None,) * 3),
                 Row(("face_encoder", f"{n}_bias"), key + ".bias", ID, (None,))]
    rows += linear(("face_encoder", "out_proj"), "face_encoder.out_proj", None, "embed")
    rows.append(Row(("face_encoder", "padding_tokens"), "face_encoder.padding_tokens", ID,
                    (None, None, None, "embed")))
    n = cfg.num_face_adapters
    for proj in ("to_q", "to_k", "to_v", "to_out"):
        rows += linear(("face_adapter", proj), f"face_adapter.{{i}}.{proj}", "embed", None, n)
    for norm in ("norm_q", "norm_k"):
        rows.append(Row(("face_adapter", norm, "scale"), f"face_adapter.{{i}}.{norm}.weight",
                        ID, ("norm",), layers=n))
    return rows


def animate_rows(cfg) -> list[Row]:
    """The rows the Animate model adds to Wan's."""
    return ([Row(("pose_patch_embedding_kernel",), "pose_patch_embedding.weight", CONV3D,
                 ("kernel_t", "kernel_h", "kernel_w", "in_channels", "embed")),
             Row(("pose_patch_embedding_bias",), "pose_patch_embedding.bias", ID, ("embed",))]
            + motion_rows(cfg) + face_rows(cfg))


(table, config_weight_table, config_param_axes, param_shardings, abstract_model,
 init_model) = convert.Variant(WanAnimateTransformer, animate_rows, (
     "motion_encoder_size", "inject_face_latents_blocks")).functions()

__all__ = ["CONV1D", "abstract_model", "animate_rows", "config_param_axes",
           "config_weight_table", "init_model", "param_shardings", "table"]
