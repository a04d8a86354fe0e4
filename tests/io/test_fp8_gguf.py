"""The checkpoints people hold: fp8 safetensors (``float8_e4m3fn`` written by torch, and
ComfyUI ``_scaled`` files with a ``scale_weight`` per tensor and a ``scaled_fp8`` marker) and
GGUF files (Q8_0 by gguf's quantizer; Q4_K / Q5_K / Q6_K as raw blocks, which gguf 0.19 can
dequantize but not quantize; F16 / BF16 / F32; a 5-D tensor with ComfyUI-GGUF's
``comfy.gguf.orig_shape``), loaded by ``ditax.load_transformer`` as a single-file Wan
checkpoint (original key names) and compared parameter by parameter with the dequantized
reference; an unsupported GGUF type fails in one line when the file is opened."""

import gguf
import jax
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx
from gguf import GGMLQuantizationType as Q
from safetensors.torch import save_file

import ditax
from ditax.errors import WeightError
from ditax.io.convert import export
from ditax.io.weights import Weights
from ditax.models.wan.build import abstract_model
from ditax.models.wan.config import WanConfig
from ditax.models.wan.convert import config_weight_table
from ditax.models.wan.original_names import key_to_original

# every linear's input width a multiple of 256 (a K-quant super-block)
CFG = WanConfig(num_attention_heads=2, attention_head_dim=128, ffn_dim=256, num_layers=1,
                in_channels=4, out_channels=4, text_dim=256, freq_dim=256)


@pytest.fixture(scope="module")
def original():
    """A random tiny Wan's tensors under their original (single-file) names, float32."""
    gen = np.random.default_rng(0)
    shapes = nnx.to_pure_dict(nnx.state(abstract_model(CFG)))
    params = jax.tree.map(lambda a: (0.05 * gen.standard_normal(a.shape)).astype(np.float32),
                          shapes)
    sd = export(config_weight_table(CFG), params)
    return {key_to_original(k): np.ascontiguousarray(v, np.float32) for k, v in sd.items()}


def load_params(path) -> dict:
    tr = ditax.load_transformer(path, config=CFG)
    sd = export(config_weight_table(tr.config), nnx.state(tr.module))
    return {key_to_original(k): np.asarray(v, np.float32) for k, v in sd.items()}


def save_reference(tmp_path, tensors) -> dict:
    """The expected tensors, written as a float32 file and loaded the same way."""
    path = tmp_path / "reference.safetensors"
    save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}, path)
    return load_params(path)


def assert_same(got, want):
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_fp8_and_comfy_scaled_fp8_files_load_dequantized(tmp_path, original):
    """Matrices in fp8 (plain e4m3fn; scaled e4m3fn with a per-tensor ``scale_weight``, one
    e5m2), the rest float32: the loaded parameters equal the fp8 values (times the scale)
    exactly, and the original weights within fp8's error. The scale, ``scale_input`` and
    marker keys are not model keys (the strict key check passes)."""
    plain, scaled, deq_plain, deq_scaled = {}, {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}, {}, {}
    for i, (k, v) in enumerate(original.items()):
        t = torch.from_numpy(v.copy())
        if v.ndim != 2:
            plain[k] = scaled[k] = t
            deq_plain[k] = deq_scaled[k] = v
            continue
        f8 = torch.float8_e5m2 if i % 5 == 0 else torch.float8_e4m3fn
        plain[k] = t.to(f8)
        deq_plain[k] = plain[k].to(torch.float32).numpy()
        s = torch.tensor(float(np.abs(v).max()) / 448.0)
        scaled[k] = (t / s).to(torch.float8_e4m3fn)
        scaled[k[:-len("weight")] + "scale_weight"] = s
        scaled[k[:-len("weight")] + "scale_input"] = torch.tensor(1.0)
        deq_scaled[k] = scaled[k].to(torch.float32).numpy() * s.numpy()
    save_file(plain, tmp_path / "wan_fp8_e4m3fn.safetensors")
    save_file(scaled, tmp_path / "wan_fp8_scaled.safetensors")
    w = Weights.open(tmp_path / "wan_fp8_scaled.safetensors")
    assert set(w.keys()) == set(original)
    assert w.dtype("blocks.0.ffn.0.weight") == np.dtype(ml_dtypes.float8_e4m3fn)
    for name, deq in (("wan_fp8_e4m3fn", deq_plain), ("wan_fp8_scaled", deq_scaled)):
        got = load_params(tmp_path / f"{name}.safetensors")
        assert_same(got, {k: np.asarray(v, np.float32) for k, v in deq.items()})
        err = max(np.abs(got[k] - original[k]).max() / np.abs(original[k]).max()
                  for k in original if original[k].ndim == 2)
        assert 0 < err <= 0.15, (name, err)     # e5m2 has 2 mantissa bits: <= 12.5 %


def raw_kquant(rng, rows: int, cols: int, qtype) -> np.ndarray:
    """Random K-quant blocks with small finite fp16 super-block scales (``d``, ``dmin``)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    d = np.asarray([2e-4, 1e-4], np.float16).view(np.uint8)
    if qtype == Q.Q6_K:
        raw[..., -2:] = d[:2]                  # Q6_K: d is the block's last field
    else:
        raw[..., :4] = d                       # Q4_K / Q5_K: d, dmin come first
    return raw.reshape(rows, -1)


def write_gguf(path, tensors: dict):
    """``tensors``: name → (array to store, GGUF type or None for its dtype, original shape)."""
    w = gguf.GGUFWriter(str(path), "wan")
    for name, (data, qtype, shape) in tensors.items():
        if shape is not None:
            w.add_array(f"comfy.gguf.orig_shape.{name}", list(shape))
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_file_loads_with_gguf_dequantization(tmp_path, rng, original):
    """Q8_0 / Q6_K / Q5_K / Q4_K / BF16 / F16 matrices, F32 vectors, the 5-D patch embedding
    flattened with its original shape recorded: the loaded parameters equal gguf's own
    dequantization; Q8_0 tensors are within 1 % of the original weights."""
    kquants = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
    cycle, stored, expect, q8 = [Q.Q8_0, *kquants, Q.BF16], {}, {}, []
    matrices = [k for k, v in original.items() if v.ndim == 2 and v.shape[1] % 256 == 0]
    for i, (k, v) in enumerate(original.items()):
        shape = None
        if k in matrices and cycle[matrices.index(k) % 5] != Q.BF16:
            qtype = cycle[matrices.index(k) % 5]
            data = (raw_kquant(rng, *v.shape, qtype) if qtype in kquants
                    else gguf.quants.quantize(v, qtype))
            q8 += [k] if qtype == Q.Q8_0 else []
        elif v.ndim == 2:
            qtype = Q.BF16 if k in matrices else None
            data = gguf.quants.quantize(v, Q.BF16) if qtype else v.astype(np.float16)
        elif v.ndim > 4:
            qtype, data, shape = None, v.reshape(v.shape[0], -1), v.shape
        else:
            qtype, data = None, v
        stored[k] = (data, qtype, shape)
        dq = gguf.quants.dequantize(data, qtype) if qtype else data.astype(np.float32)
        expect[k] = np.asarray(dq, np.float32).reshape(v.shape)
    assert {Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.BF16} <= {t[1] for t in stored.values()}
    write_gguf(tmp_path / "wan-Q4_K_M.gguf", stored)
    got = load_params(tmp_path / "wan-Q4_K_M.gguf")
    assert_same(got, save_reference(tmp_path, expect))
    for k in q8:
        assert np.abs(got[k] - original[k]).max() <= 0.01 * np.abs(original[k]).max(), k


def test_gguf_unsupported_type_fails_in_one_line(tmp_path):
    x = np.ones((2, 32), np.float32)
    write_gguf(tmp_path / "q40.gguf", {"head.head.weight": (gguf.quants.quantize(x, Q.Q4_0),
                                                            Q.Q4_0, None)})
    with pytest.raises(WeightError) as e:
        ditax.load_transformer(tmp_path / "q40.gguf", config=CFG)
    msg = str(e.value)
    assert "\n" not in msg and "head.head.weight is GGUF type Q4_0" in msg
    assert "supported: F32, F16, BF16, Q8_0, Q6_K, Q5_K, Q4_K" in msg
