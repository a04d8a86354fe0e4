"""``ditax plan ... model.quantize=int8|fp8``: the plan's parameters are the loaded 8-bit
model's (:func:`ditax.nn.quant.quantize_module` on the abstract model, as the loader does).

Wan 2.1 14B (abstract, nothing compiled, 8 CPU devices, fsdp 8): with bf16 weights vs int8 /
fp8 block linears the total bytes drop by exactly one byte per block-linear weight, plus the
float32 scales (one per output channel), and to about half (26.6 -> 13.5 GiB, 0.51x; the issue's
"weights <= 15 GiB in 8 bits"); the per-device bytes follow (scales sharded like their
kernels); the plan names the mode and that CPU dots are not native 8-bit.
"""

import json

from ditax.cli import main as cli_main

GIB = 2 ** 30


def _plan(capsys, *overrides):
    assert cli_main(["plan", "wan2.1-t2v-14b", "mesh.fsdp=8", "model.param_dtype=bfloat16",
                     *overrides, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_weight_bytes_in_8_bits(capsys):
    full = _plan(capsys)
    q, mode = _plan(capsys, "model.quantize=int8"), "int8"
    assert _plan(capsys, "model.quantize=fp8")["param_bytes_total"] == q["param_bytes_total"]
    # the block linears of 40 layers: self q/k/v/o + cross q/k/v/o (D x D) + FFN in / out
    d, m, layers = 5120, 13824, 40
    weights = layers * (8 * d * d + 2 * d * m)
    scales = layers * 4 * (8 * d + m + d)
    assert full["param_bytes_total"] - q["param_bytes_total"] == weights - scales
    ratio = q["param_bytes_total"] / full["param_bytes_total"]
    assert 0.5 < ratio < 0.55 and q["param_bytes_total"] < 15 * GIB, ratio
    assert q["param_bytes_per_device"] < 0.55 * full["param_bytes_per_device"]
    assert q["quantize"] == {"mode": mode, "activations": False, "native_dots": False,
                             "dots": f"{mode} weights on cpu: dots in the compute dtype "
                                     f"(8-bit storage: memory only)"}
    assert "quantize" not in full
