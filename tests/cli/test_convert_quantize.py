"""``ditax convert FOLDER --quantize int8|fp8 --out DIR``: ditax's 8-bit folder
(:mod:`ditax.nn.quant_folder`) and its load back.

A tiny random Wan folder (2 heads x 16, 2 layers, written from ditax's own export: no torch) is
converted per mode. The folder holds 8-bit ``weight`` s (``I8`` / ``F8_E4M3`` in the header)
with a float32 ``weight_scale`` per output row and a ``quantization_config``; loaded with
``quantize=mode`` every parameter (8-bit kernels, scales, float tensors) equals, bit for bit,
quantize-on-read of the float folder — on one device and (int8) on an 8-device fsdp mesh;
loaded without ``quantize=`` its kernels are exactly ``q · scale`` in float32. No forward runs:
equal parameters in the same graph give the same outputs. Bad input: ``--quantize`` without
``--out``, an int8 folder loaded with ``quantize='fp8'``.
"""

import json
import logging

import numpy as np
import pytest
from flax import nnx

import ditax
from ditax.cli import main as cli_main
from ditax.errors import ConfigError
from ditax.io.fp8 import read_header
from quant_folders import write_wan_folder

@pytest.fixture(scope="module")
def float_folder(tmp_path_factory):
    return write_wan_folder(tmp_path_factory.mktemp("cq") / "wan")


def _flat(tr):
    return {tuple(map(str, p)): np.asarray(v.get_value())
            for p, v in nnx.to_flat_state(nnx.state(tr.module, nnx.Param))}


def _assert_same(a, b):
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        assert fa[k].dtype == fb[k].dtype, k
        np.testing.assert_array_equal(fa[k].view(np.uint8), fb[k].view(np.uint8), err_msg=str(k))


@pytest.mark.parametrize("mode,tag", [("int8", "I8"), ("fp8", "F8_E4M3")])
def test_convert_quantize_loads_back_bit_equal(tmp_path, float_folder, capsys, caplog, mode,
                                               tag):
    out = tmp_path / f"wan-{mode}"
    assert cli_main(["convert", str(float_folder), "--quantize", mode, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"quantize='{mode}'" in printed and "OK" in printed, printed
    header, _ = read_header(out / "diffusion_pytorch_model.safetensors", "")
    q = header["blocks.0.attn1.to_q.weight"]
    assert q["dtype"] == tag and q["shape"] == [32, 32]
    s = header["blocks.1.ffn.net.0.proj.weight_scale"]
    assert s["dtype"] == "F32" and s["shape"] == [64]
    assert header["patch_embedding.weight"]["dtype"] == "F32"          # not a block linear
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "ditax" and qc["weights"] == mode

    with caplog.at_level(logging.INFO, logger="ditax.nn.quant"):
        stored = ditax.load_transformer(out, quantize=mode)
    assert f"stored {mode}: the folder's own scales" in caplog.text
    _assert_same(stored, ditax.load_transformer(float_folder, quantize=mode))
    if mode == "int8":
        mesh = ditax.make_mesh({"fsdp": 8})
        _assert_same(ditax.load_transformer(out, quantize=mode, mesh=mesh),
                     ditax.load_transformer(float_folder, quantize=mode, mesh=mesh))
        with pytest.raises(ConfigError, match=r"quantize='fp8': .* is a ditax int8 folder"):
            ditax.load_transformer(out, quantize="fp8")

    plain = ditax.load_transformer(out).module.blocks.ffn.proj_in       # dequantized
    lin = stored.module.blocks.ffn.proj_in
    want = (np.asarray(lin.kernel[...], np.float32)
            * np.asarray(lin.kernel_scale[...])[:, None, :])
    assert plain.kernel[...].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(plain.kernel[...]), want)


def test_convert_quantize_needs_out(float_folder, capsys):
    assert cli_main(["convert", str(float_folder), "--quantize", "int8"]) == 2
    assert "--quantize int8 writes a folder; pass --out FOLDER" in capsys.readouterr().err
