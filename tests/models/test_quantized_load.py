"""``ditax.load_transformer(..., quantize=)``: 8-bit block weights read slice by slice.

A tiny random Wan (2 heads x 16, 2 layers; folder written from ditax's own export, so no torch)
loaded unquantized, with int8 weights on one device and on an 8-device fsdp mesh (the same
int8 kernels bit for bit, outputs equal to float rounding), with fp8 weights, and with int8
activations (the jitted forward's HLO has s8 x s8 -> s32 dots). Stated bounds on the output's
relative error vs the unquantized model (measured on these random weights): int8 2e-2
(6.7e-3), fp8 8e-2 (3.8e-2), int8 weights + activations 3e-2 (9.4e-3), Flux int8 2e-2 (9.2e-3). Bytes: every block-linear kernel 1 byte a weight plus a
float32 scale per output channel, everything else float32 as before. A tiny Flux (int8,
one case) the same. Bad input: an unknown mode, activations without a mode, a GGUF file, an
fp8 file with int8 — one ConfigError line each, before any tensor is read (unmerged LoRAs
on 8-bit kernels: tests/lora/test_unmerged_quantized.py).
"""

import json
import logging
import math
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

import ditax
from ditax.errors import ConfigError
from ditax.io.convert import export
from ditax.nn.quant import quantized_kernels, weight_bytes
from wan_reference import rel_err

WAN = dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=64, num_layers=2,
           in_channels=4, out_channels=4, text_dim=32, freq_dim=32)


def _write_folder(folder, cfg, table, abstract, seed=0):
    gen = np.random.default_rng(seed)
    shapes = nnx.to_pure_dict(nnx.state(abstract))
    params = jax.tree.map(lambda a: (0.2 * gen.standard_normal(a.shape)).astype(np.float32),
                          shapes)
    folder.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in export(table, params).items()},
              str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg.to_diffusers()))
    return folder


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory):
    from ditax.models.wan.build import abstract_model
    from ditax.models.wan.config import WanConfig
    from ditax.models.wan.convert import config_weight_table

    cfg = WanConfig(**WAN)
    return _write_folder(tmp_path_factory.mktemp("q") / "wan", cfg, config_weight_table(cfg),
                         abstract_model(cfg))


def _wan_inputs(b=8):
    gen = np.random.default_rng(1)
    return (gen.standard_normal((b, 4, 2, 8, 8)).astype(np.float32),
            np.full((b,), 500.0, np.float32),
            gen.standard_normal((b, 7, 32)).astype(np.float32))


def _expected_bytes(tr) -> int:
    """Float32 everywhere, except 1 byte per block-linear weight (+ its float32 scales)."""
    state = nnx.state(tr.module, nnx.Param)
    q = set(quantized_kernels(state))
    total = 0
    for path, leaf in nnx.to_flat_state(state):
        p = tuple(str(k) for k in path)
        total += math.prod(leaf.get_value().shape) * (1 if p in q else 4)
    return total


@pytest.fixture(scope="module")
def wan_full(wan_folder):
    """The unquantized model and its output on :func:`_wan_inputs` (one compile)."""
    full = ditax.load_transformer(wan_folder)
    return full, np.asarray(full(*_wan_inputs()))


def test_wan_int8_one_device_and_fsdp_mesh(wan_folder, wan_full):
    x, t, c = _wan_inputs()
    full, y_full = wan_full
    one = ditax.load_transformer(wan_folder, quantize="int8")
    mesh = ditax.load_transformer(wan_folder, quantize="int8",
                                  mesh=ditax.make_mesh({"fsdp": 8}))
    y_one, y_mesh = (np.asarray(m(x, t, c)) for m in (one, mesh))

    kernels = quantized_kernels(nnx.state(one.module))
    # 2 self-attention q/k/v/o + 4 cross-attention + 2 FFN linears (stacked over layers)
    assert len(kernels) == 10, kernels
    q1, qm = nnx.to_pure_dict(nnx.state(one.module)), nnx.to_pure_dict(nnx.state(mesh.module))
    for p in kernels:
        a, b = q1, qm
        for k in p:
            a, b = a[k], b[k]
        assert a.dtype == jnp.int8 and b.dtype == jnp.int8, p
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ffn = mesh.module.blocks.ffn.proj_in
    assert "fsdp" in str(ffn.kernel[...].sharding.spec)          # sharded like the float one
    assert one.module.patch_embedding_kernel[...].dtype == jnp.float32   # embeddings stay
    assert one.module.proj_out.kernel[...].dtype == jnp.float32          # head stays

    assert rel_err(y_mesh, y_one) < 1e-5
    err = rel_err(y_one, y_full)
    assert 1e-4 < err < 2e-2, err
    got, full_bytes = weight_bytes(nnx.state(one.module)), weight_bytes(nnx.state(full.module))
    assert got == _expected_bytes(one) < 0.55 * full_bytes, (got, full_bytes)
    print(f"int8: rel err {err:.2e}, weights {got} B vs float32 {full_bytes} B")


def test_wan_fp8_and_int8_activations(wan_folder, wan_full, caplog):
    x, t, c = _wan_inputs()
    y_full = wan_full[1]
    with caplog.at_level(logging.INFO, logger="ditax.nn.quant"):
        fp8 = ditax.load_transformer(wan_folder, quantize="fp8", quantize_activations=True)
    assert "10 block linears, fp8 weights x fp8 activations on cpu" in caplog.text
    assert "8-bit dots emulated" in caplog.text
    fp8 = ditax.load_transformer(wan_folder, quantize="fp8")
    assert fp8.module.blocks.attn1.to_q.kernel[...].dtype == jnp.float8_e4m3fn
    err = rel_err(np.asarray(fp8(x, t, c)), y_full)
    assert 1e-3 < err < 8e-2, err
    act = ditax.load_transformer(wan_folder, quantize="int8", quantize_activations=True)
    hlo = jax.jit(lambda m, x, t, c: m(x, t, c)).lower(act, x, t, c).as_text()
    s8 = [ln for ln in hlo.splitlines()
          if "dot_general" in ln and ln.count("xi8>") >= 2 and "xi32>" in ln]
    assert len(s8) >= 10, len(s8)   # every block linear (q/k/v/o x 2, FFN x 2)
    err_a = rel_err(np.asarray(act(x, t, c)), y_full)
    assert err_a < 3e-2, err_a
    print(f"fp8: rel err {err:.2e}; int8 W+A: {err_a:.2e}, {len(s8)} s8 x s8 dots")


def test_flux_int8(tmp_path):
    from flux_reference import TINY, flux_inputs
    from ditax.models.flux.build import abstract_model
    from ditax.models.flux.config import FluxConfig
    from ditax.models.flux.convert import weight_table

    cfg = FluxConfig.from_diffusers(TINY)
    folder = _write_folder(tmp_path / "flux", cfg, weight_table(cfg), abstract_model(cfg))
    inputs = flux_inputs(np.random.default_rng(2), TINY)
    full = ditax.load_transformer(folder)
    q = ditax.load_transformer(folder, quantize="int8")
    m = q.module
    assert m.transformer_blocks.attn.to_q.kernel[...].dtype == jnp.int8
    assert m.single_transformer_blocks.proj_mlp.kernel[...].dtype == jnp.int8
    assert m.transformer_blocks.norm1.linear.kernel[...].dtype == jnp.float32  # modulation
    err = rel_err(np.asarray(q(**inputs)), np.asarray(full(**inputs)))
    assert 1e-4 < err < 2e-2, err
    assert weight_bytes(nnx.state(m)) == _expected_bytes(q)
    print(f"flux int8: rel err {err:.2e}")


def _fp8_safetensors(path):
    """A one-tensor safetensors file with an F8_E4M3 tensor (header written by hand)."""
    data = np.zeros((4, 4), np.uint8).tobytes()
    header = json.dumps({"head.head.weight": {"dtype": "F8_E4M3", "shape": [4, 4],
                                              "data_offsets": [0, len(data)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_bad_quantize_input(tmp_path, wan_folder):
    import gguf

    from ditax.models.wan.config import WanConfig

    with pytest.raises(ConfigError, match=r"model.quantize='int4' .*int8, fp8"):
        ditax.load_transformer(wan_folder, quantize="int4")
    with pytest.raises(ConfigError, match="quantize_activations=true needs"):
        ditax.load_transformer(wan_folder, quantize_activations=True)
    with pytest.raises(ConfigError, match=r"model.quantize='int4'"):   # before the folder
        ditax.load_pipeline(tmp_path / "no-such-pipeline", quantize="int4")
    w = gguf.GGUFWriter(str(tmp_path / "wan-Q8_0.gguf"), "wan")
    w.add_tensor("head.head.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ConfigError, match=r"quantize='int8': .*wan-Q8_0.gguf is a GGUF file"):
        ditax.load_transformer(tmp_path / "wan-Q8_0.gguf", config=WanConfig(**WAN),
                               quantize="int8")
    f8 = _fp8_safetensors(tmp_path / "wan_fp8_e4m3fn.safetensors")
    with pytest.raises(ConfigError, match=r"already stored in fp8 .*quantize='fp8'"):
        ditax.load_transformer(f8, config=WanConfig(**WAN), quantize="int8")


def test_training_refuses_quantize():
    from ditax.config import load_config

    cfg = load_config("tiny", ["model.quantize=int8"])
    ditax.validate(cfg)                                  # inference: fine
    with pytest.raises(ConfigError, match="model.quantize=int8 is for inference"):
        ditax.validate(cfg, training=True)


def test_merged_lora_then_quantized(tmp_path, wan_folder):
    """A merged LoRA is folded into each float slice before it is quantized: the int8 kernels
    equal those of the float-merged model saved and loaded with quantize='int8'."""
    from lora_reference import block_modules, write_peft
    from ditax.models.wan.convert import config_weight_table

    d, f = 32, 64
    shapes = {"attn1.to_q": (d, d), "ffn.net.0.proj": (f, d), "ffn.net.2": (d, f)}
    gen = np.random.default_rng(3)
    lora = {m: dict(down=(0.3 * gen.standard_normal((4, shapes[m.split(".", 2)[2]][1])))
                    .astype(np.float32),
                    up=(0.3 * gen.standard_normal((shapes[m.split(".", 2)[2]][0], 4)))
                    .astype(np.float32), alpha=None, bias=None)
            for m in block_modules(2, tuple(shapes))}
    path = write_peft(tmp_path / "lora.safetensors", lora)
    merged = ditax.load_transformer(wan_folder, loras=[(path, 0.8)])
    folder = tmp_path / "merged"
    folder.mkdir()
    table = config_weight_table(merged.config)
    save_file({k: np.ascontiguousarray(v) for k, v in export(table, merged.module).items()},
              str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text((wan_folder / "config.json").read_text())
    a = ditax.load_transformer(wan_folder, loras=[(path, 0.8)], quantize="int8").module
    b = ditax.load_transformer(folder, quantize="int8").module
    for lin in ("attn1.to_q", "ffn.proj_in", "ffn.proj_out", "attn1.to_k"):
        la, lb = a.blocks, b.blocks
        for part in lin.split("."):
            la, lb = getattr(la, part), getattr(lb, part)
        np.testing.assert_array_equal(np.asarray(la.kernel[...]), np.asarray(lb.kernel[...]))
        np.testing.assert_array_equal(np.asarray(la.kernel_scale[...]),
                                      np.asarray(lb.kernel_scale[...]))
    plain = ditax.load_transformer(wan_folder, quantize="int8").module
    assert not np.array_equal(np.asarray(plain.blocks.ffn.proj_in.kernel[...]),
                              np.asarray(a.blocks.ffn.proj_in.kernel[...]))
