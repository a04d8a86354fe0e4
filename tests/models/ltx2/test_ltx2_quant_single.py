"""LTX-2's 8-bit weights, original (Lightricks) single files and ``ditax bench``.

One tiny random diffusers ``LTX2VideoTransformer3DModel`` (LTX-2-like: 2 blocks, 2 heads x 8
in both streams) for every test, compiled with most XLA optimisations off.

- 8 bits: ``quantize="int8" | "fp8"`` stores the 28 block linears (video and audio self- and
  text attention, the a<->v attentions, both feed-forwards) in 8 bits with per-channel scales
  (the embedders, modulation and output heads stay float); against the float model, each
  block's update of both streams (``block(h) - h`` on the float model's block inputs) and
  each stream's output within the Wan / Flux bars of tests/models/test_quantized_load.py
  (int8 2e-2, fp8 8e-2; measured: updates int8 <= 4.4e-3, fp8 <= 1.6e-2; outputs int8
  3.0e-3 / 9.4e-4 video / audio; fp8's outputs, 6.5e-3 / 3.7e-3, are not compiled here). A
  PEFT LoRA merged then quantized, and unmerged on the very int8 kernels of the plain int8
  model: the two outputs within the int8 bar of each other, both far from the LoRA-less one.
  ``ditax convert FOLDER --quantize int8 --out DIR`` loads back (``quantize="int8"``) equal
  to quantize-on-read of the float folder, every parameter bit for bit.
- single files: the transformer written under the original key names (the inverse of
  diffusers' conversion map, tests/refs/ltx2_single_reference.py) with connectors, VAE and
  vocoder stand-ins beside it loads with ``config=`` and matches diffusers within 1e-5;
  ``ditax convert FILE --config YAML --out DIR`` writes the diffusers folder bit for bit. A
  missing or unknown key: one ``WeightError`` line naming it.
- ``ditax bench``'s steps (capability checks, ``forward_benchmark``) on a YAML of the tiny
  model, on one device: its row.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx
from safetensors.numpy import load_file

import ditax
from ditax.cli import main as cli_main
from ditax.errors import WeightError
from ditax.models.ltx2.config import LTX2Config
from ditax.nn.quant import quantized_kernels
from ltx2_reference import LTX2, ltx2_inputs, make_diffusers_ltx2, run_diffusers_ltx2
from ltx2_single_reference import PREFIX, write_original
from wan_reference import rel_err

#: LTX-2-like, each output its input's width (``ditax bench`` validates the config as a
#: training one would be: the flow loss compares the prediction with the latents)
TINY = dict(LTX2, out_channels=LTX2["in_channels"], audio_out_channels=LTX2["audio_in_channels"])


@pytest.fixture(scope="module")
def ref(tmp_path_factory, fast_compile):
    """(torch model, its folder, inputs, the float ditax outputs, a YAML of its config)."""
    root = tmp_path_factory.mktemp("ltx2q")
    m, folder = make_diffusers_ltx2(root, **TINY)
    inputs = ltx2_inputs(np.random.default_rng(3), TINY, b=1)
    full = [np.asarray(o) for o in ditax.load_transformer(folder)(**inputs)]
    cfg = LTX2Config.from_diffusers(json.loads((folder / "config.json").read_text()))
    model = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_diffusers().items()
             if k != "_class_name"}
    spec = root / "ltx2-tiny.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "ltx2-tiny", "model": {"family": "ltx2", **model},
        "mesh": {"data": 1, "fsdp": -1, "context": 1, "tensor": 1},
        "attention": {"backend": "xla"}}))
    return m, folder, inputs, full, spec


def _errs(tr, inputs, full):
    return [rel_err(np.asarray(o), f) for o, f in zip(tr(**inputs), full)]


@jax.jit
def _block_updates(float_module, q_module, arrays, positions):
    """Each block's update ``block(h) - h`` of both streams, float and 8-bit, on the float
    model's own block inputs ``h``: ``[(float (video, audio), 8-bit (video, audio))]``."""
    h, ctx = float_module.embed(**arrays, positions=positions)
    out = []
    for i in range(float_module.cfg.num_layers):
        hf, hq = (m.run_blocks(h, ctx, i, i + 1) for m in (float_module, q_module))
        out.append((jax.tree.map(jnp.subtract, hf, h), jax.tree.map(jnp.subtract, hq, h)))
        h = hf
    return out


def test_int8_and_fp8_forward(ref):
    _, folder, inputs, full, _ = ref
    sizes = ("num_frames", "height", "width", "fps", "audio_num_frames")
    arrays = {k: jnp.asarray(v) for k, v in inputs.items() if k not in sizes}
    float_module = ditax.load_transformer(folder).module
    positions = float_module.positions(**{k: inputs[k] for k in sizes})
    for mode, dtype, bar in (("int8", jnp.int8, 2e-2), ("fp8", jnp.float8_e4m3fn, 8e-2)):
        q = ditax.load_transformer(folder, quantize=mode)
        kernels = quantized_kernels(nnx.state(q.module))
        # 6 attentions x q / k / v / out, 2 feed-forwards x in / out (stacked over blocks)
        assert len(kernels) == 28, kernels
        blocks = q.module.transformer_blocks
        for lin in (blocks.audio_to_video_attn.to_k, blocks.video_to_audio_attn.to_out,
                    blocks.audio_ff.proj_out, blocks.attn2.to_v):
            assert lin.kernel[...].dtype == dtype
        for lin in (q.module.proj_in, q.module.audio_proj_out, q.module.time_embed.linear):
            assert lin.kernel[...].dtype == jnp.float32       # embedders, heads stay float
        blocks = [[rel_err(np.asarray(b), np.asarray(a)) for a, b in zip(*pair)]
                  for pair in _block_updates(float_module, q.module, arrays, positions)]
        assert all(1e-4 < e < bar for e in sum(blocks, [])), (mode, blocks)
        print(f"{mode}: rel err of each block's update (video, audio) "
              f"{[[f'{e:.1e}' for e in b] for b in blocks]}")
        if mode == "int8":      # its program is the LoRA test's merged one (compiled once)
            errs = _errs(q, inputs, full)
            assert all(1e-4 < e < bar for e in errs), (mode, errs)
            print(f"int8: rel err of the outputs (video, audio) {errs}")


def test_loras_merged_and_unmerged_on_int8(ref, tmp_path):
    from lora_reference import write_peft

    from ditax.lora.unmerged import LoraLinear

    _, folder, inputs, full, _ = ref
    gen = np.random.default_rng(7)
    shapes = {"attn1.to_q": (16, 16), "audio_to_video_attn.to_k": (16, 16),
              "ff.net.0.proj": (64, 16), "audio_ff.net.2": (16, 64)}
    lora = {f"transformer_blocks.{i}.{m}": dict(
        down=(0.3 * gen.standard_normal((4, s[1]))).astype(np.float32),
        up=(0.3 * gen.standard_normal((s[0], 4))).astype(np.float32), alpha=None, bias=None)
        for i in range(2) for m, s in shapes.items()}
    loras = [(write_peft(tmp_path / "lora.safetensors", lora), 0.8)]
    plain = ditax.load_transformer(folder, quantize="int8")
    unmerged = ditax.load_transformer(folder, quantize="int8", loras=loras,
                                      lora_mode="unmerged")
    a, b = unmerged.module.transformer_blocks.ff.proj_in, plain.module.transformer_blocks.ff.proj_in
    assert isinstance(a, LoraLinear) and a.kernel[...].dtype == jnp.int8
    np.testing.assert_array_equal(np.asarray(a.kernel[...]), np.asarray(b.kernel[...]))
    np.testing.assert_array_equal(np.asarray(a.kernel_scale[...]),
                                  np.asarray(b.kernel_scale[...]))
    merged = ditax.load_transformer(folder, quantize="int8", loras=loras)
    assert merged.module.transformer_blocks.attn1.to_q.kernel[...].dtype == jnp.int8
    y_un = [np.asarray(o) for o in unmerged(**inputs)]
    y_merged = [np.asarray(o) for o in merged(**inputs)]
    errs = [rel_err(u, m) for u, m in zip(y_un, y_merged)]
    assert all(e < 2e-2 for e in errs), errs
    moved = [rel_err(m, f) for m, f in zip(y_merged, full)]
    assert all(e > 5e-2 for e in moved), moved          # the LoRA changes both streams
    print(f"LoRA on int8: unmerged vs merged {errs}, vs no LoRA {moved}")


def test_convert_quantize_loads_back_equal(ref, tmp_path, capsys):
    _, folder, *_ = ref
    out = tmp_path / "int8"
    assert cli_main(["convert", str(folder), "--quantize", "int8", "--out", str(out)]) == 0
    assert "OK" in capsys.readouterr().out
    stored = ditax.load_transformer(out, quantize="int8")
    fresh = ditax.load_transformer(folder, quantize="int8")
    flat = lambda tr: {tuple(map(str, p)): np.asarray(v.get_value())  # noqa: E731
                       for p, v in nnx.to_flat_state(nnx.state(tr.module, nnx.Param))}
    a, b = flat(stored), flat(fresh)
    assert a.keys() == b.keys() and len(quantized_kernels(nnx.state(stored.module))) == 28
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k].view(np.uint8), b[k].view(np.uint8), err_msg=str(k))


def test_original_single_file(ref, tmp_path, capsys):
    m, folder, inputs, _, spec = ref
    path = tmp_path / "ltx-2-tiny.safetensors"
    written = write_original(m, path)
    assert {PREFIX + "patchify_proj.weight", "vae.decoder.conv_in.conv.weight"} <= set(written)
    cfg = LTX2Config.from_diffusers(json.loads((folder / "config.json").read_text()))
    tr = ditax.load_transformer(path, config=cfg)
    errs = [rel_err(o, r) for o, r in zip(tr(**inputs), run_diffusers_ltx2(m, inputs))]
    assert all(e <= 1e-5 for e in errs), errs
    print(f"original single file vs diffusers: video {errs[0]:.1e}, audio {errs[1]:.1e}")

    assert cli_main(["convert", str(path), "--config", str(spec)]) == 0
    assert "OK" in capsys.readouterr().out
    out = tmp_path / "converted"
    assert cli_main(["convert", str(path), "--config", str(spec), "--out", str(out)]) == 0
    got = load_file(str(out / "diffusion_pytorch_model.safetensors"))
    want = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.parametrize("case", ["missing", "unknown_in_transformer", "unknown_part"])
def test_single_file_key_errors(ref, tmp_path, case):
    m, folder, *_ = ref
    cfg = LTX2Config.from_diffusers(json.loads((folder / "config.json").read_text()))
    key = {"missing": PREFIX + "transformer_blocks.1.attn1.q_norm.weight",
           "unknown_in_transformer": PREFIX + "transformer_blocks.0.attn1.to_x.weight",
           "unknown_part": "upsampler.conv.weight"}[case]
    extra = {} if case == "missing" else {key: np.zeros((2, 2), np.float32)}
    path = tmp_path / "bad.safetensors"
    write_original(m, path, drop=[key] if case == "missing" else (), extra=extra)
    with pytest.raises(WeightError) as e:
        ditax.load_transformer(path, config=cfg)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and key in msg, msg
    assert ("missing 1 key" if case == "missing" else "unexpected 1 key") in msg, msg


def test_bench(ref):
    """``ditax bench``'s steps (the CLI's capability checks, then
    :func:`ditax.bench.forward_benchmark`) on a one-device mesh: the tiny model's row."""
    import jax

    from ditax.bench import forward_benchmark
    from ditax.config import load_config, validate
    from ditax.config.families import check_capabilities
    from ditax.models import registry

    cfg = load_config(str(ref[4]), ["mesh.fsdp=1"])
    registry.require("ltx2", "bench", "ditax bench", "")
    check_capabilities(cfg, "ditax bench")
    validate(cfg, 1)
    mesh = ditax.make_mesh(cfg.mesh, devices=jax.devices()[:1])
    row = forward_benchmark(cfg, mesh, (2, 2, 3), text_len=3, repeats=1)
    assert row["case"] == "ltx2-tiny" and row["value"] > 0
    assert row["latent"] == [1, 12, TINY["in_channels"]], row      # 2 x 2 x 3 video tokens


def test_ltx23_original_names_headers_only():
    """LTX-2.3's parts (gated attention, sigma-dependent text modulation ``prompt_adaln_single``,
    keyframe embedding) under their original names fit the renamed table: headers only."""
    import torch
    from diffusers import LTX2VideoTransformer3DModel

    from ditax.io.convert import check_weights, param_shapes
    from ditax.models.ltx2.transformer.build import abstract_model
    from ditax.models.ltx2.transformer.convert import weight_table
    from ditax.models.ltx2.transformer.single_file import file_table
    from ltx2_reference import LTX23
    from ltx2_single_reference import original_key, other_parts

    config = dict(LTX23, use_prompt_adaln_single=True)
    with torch.device("meta"):
        sd = LTX2VideoTransformer3DModel(**config).state_dict()
    shapes = {original_key(k): tuple(v.shape) for k, v in sd.items()}
    shapes.update({k: v.shape for k, v in other_parts(np.random.default_rng(0)).items()})
    assert PREFIX + "prompt_adaln_single.linear.weight" in shapes
    assert PREFIX + "transformer_blocks.0.attn1.to_gate_logits.weight" in shapes

    class Header:
        keys = shapes.keys
        shape = shapes.__getitem__

    cfg = LTX2Config.from_diffusers(config)
    table, _ = file_table(weight_table(cfg), shapes)
    check_weights(table, Header(), param_shapes(nnx.state(abstract_model(cfg))))
