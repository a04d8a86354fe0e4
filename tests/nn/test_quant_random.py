"""``ditax bench``'s random transformer under ``model.quantize`` (issue 54 item 3): quantized as
the loader quantizes, drawn in 8 bits.

Before, ``family.random_transformer`` ignored ``model.quantize`` (only the folder loader
quantized), so ``ditax bench ... model.quantize=int8`` timed the bf16 model. Now every family
with the ``quantize`` and ``bench`` capabilities builds its block linears with 8-bit kernels
and float32 scales, sharded as loaded (the kernels' shardings, the scales' the kernels'
without the input axis), their dequantized weights of the float init's scale (LeCun normal:
std 1/sqrt(fan_in)), the dots of ``quantize_activations``; the init program compiled for a
TPU v5e writes only the 8-bit model (no float copy of a quantized kernel, no temporaries),
8-bit host arrays under ``model.offload=host`` in their per-layer copy layout; and fp8
activations are refused on a v5e before any work (:mod:`ditax.nn.quant_target`).
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.config.loader import load_config
from ditax.errors import ConfigError
from ditax.models.base import model_family
from ditax.nn.linear import Linear
from ditax.nn.quant import SCALE, quantized_kernels, weight_bytes
from ditax.nn.quant_random import random_kernel
from ditax.nn.quant_target import check_dots, native_dots
from ditax.parallel import make_mesh

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (deviceless TPU compile)")

V5E = SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")


def _at(tree: dict, path):
    for p in path:
        tree = next(v for k, v in tree.items() if str(k) == p)
    return tree


def _ltx2_tiny():
    """LTX-2's tiny test config (no preset is small enough) as a family."""
    from ltx2_reference import LTX2  # tests/refs

    from ditax.models.ltx2.config import LTX2Config

    cfg = LTX2Config.from_diffusers(dict(LTX2, out_channels=LTX2["in_channels"],
                                         audio_out_channels=LTX2["audio_in_channels"]),
                                    quantize="int8", quantize_activations=True)
    return model_family(cfg)


@pytest.mark.parametrize("preset", ["tiny", "flux-tiny", "flux2-tiny", "ltx2"])
def test_random_transformer_is_quantized(preset):
    """int8 weights x int8 activations: every block linear has an int8 kernel and float32
    scales, sharded as the loader shards them; the other parameters keep the float init the
    unquantized model draws; the forward runs and is finite."""
    if preset == "ltx2":
        family, mesh = _ltx2_tiny(), make_mesh({"fsdp": 2}, jax.devices()[:2])
    else:
        cfg = load_config(preset, ["mesh.fsdp=2", "mesh.data=1", "model.quantize=int8",
                                   "model.quantize_activations=true"])
        family, mesh = model_family(cfg.model, cfg.attention), make_mesh(
            cfg.mesh, jax.devices()[:2])
    tr = family.random_transformer(mesh, seed=3)
    state = nnx.state(tr.module)
    pure = nnx.to_pure_dict(state)
    paths = quantized_kernels(pure)
    assert paths
    for path in paths:
        k, s = _at(pure, path), _at(pure, path[:-1] + (SCALE,))
        assert k.dtype == jnp.int8 and s.dtype == jnp.float32
        assert s.shape == k.shape[:-2] + k.shape[-1:]
    # every parameter sharded as the loader shards it (scales like their kernels)
    want = jax.tree.leaves(family.param_shardings(state, mesh))
    assert [x.sharding.spec for x in jax.tree.leaves(state)] == [w.spec for w in want]
    assert any("fsdp" in str(_at(pure, p).sharding.spec) for p in paths)
    linears = [m for _, m in nnx.iter_graph(tr.module) if isinstance(m, Linear) and m.quant]
    assert len(linears) == len(paths)
    assert all(m.quant.activations and m.quant.mode == "int8" for m in linears)
    # the rest is the float model's init (the same keys drawn the same way)
    plain = model_family(_without_quantize(family.model), family.attention)
    ref = jax.tree_util.tree_flatten_with_path(
        nnx.to_pure_dict(nnx.state(plain.random_transformer(mesh, seed=3).module)))[0]
    eight = set(paths) | {p[:-1] + (SCALE,) for p in paths}
    rest = [(key, v) for key, v in ((tuple(str(getattr(k, "key", k)) for k in p), v)
                                    for p, v in ref) if key not in eight]
    assert rest and all(np.array_equal(np.asarray(v), np.asarray(_at(pure, key)))
                        for key, v in rest)
    args, kw = family.random_inputs(2, None, 8, np.random.default_rng(0))
    out = tr(*args, **kw)
    assert all(bool(jnp.all(jnp.isfinite(o))) for o in jax.tree.leaves(out))


def _without_quantize(m):
    import dataclasses

    return dataclasses.replace(m, quantize="none", quantize_activations=False)


def test_random_kernel_has_the_float_init_scale():
    """Dequantized, a random 8-bit kernel is LeCun normal: std 1/sqrt(fan_in) (fan_in the
    input axis, second to last in both layouts), every value on the 8-bit grid, each output
    channel's max near qmax (the grid used whole, as a quantized float kernel's is)."""
    for mode, qmax in (("int8", 127), ("fp8", 448)):
        for shape in ((2, 512, 384), (3, 4, 512, 96)):
            q, s = random_kernel(jax.random.key(0), shape, mode)
            assert q.shape == shape and s.shape == shape[:-2] + shape[-1:]
            w = q.astype(jnp.float32) * jnp.expand_dims(s, -2)
            assert abs(float(jnp.std(w)) * np.sqrt(512) - 1) < 0.02, (mode, shape)
            top = jnp.max(jnp.abs(q.astype(jnp.float32)), axis=-2)
            assert float(jnp.max(top)) <= qmax and float(jnp.min(top)) > 0.9 * qmax


@needs_libtpu
@pytest.mark.parametrize("offload", ["none", "host"])
def test_init_program_writes_only_the_8_bit_model(offload):
    """A Wan of 128-wide heads (2 layers, D = 512) on a v5e, int8: the compiled init program's
    outputs are the 8-bit model's bytes (its block linears' half the bf16 model's); it holds
    no float copy of a quantized kernel (no temporaries: 0 bytes; offloaded, at most the
    8-bit arrays on their way to the host), and the host kernels have the layout their
    per-layer copies need."""
    from ditax.models.wan.build import _BUILD
    from ditax.plan.targets import parse_target, topology_devices

    devices = topology_devices(parse_target("tpu-v5e-1"))

    def program(*extra):
        cfg = load_config("tiny", ["model.attention_head_dim=128", "model.ffn_dim=1024",
                                   "model.param_dtype=bfloat16", f"model.offload={offload}",
                                   *extra])
        return _BUILD.init_program(cfg.model, cfg.attention, make_mesh(cfg.mesh, devices), 0)[1]

    init = program("model.quantize=int8", "model.quantize_activations=true")
    shapes = init.eval_shape()
    assert quantized_kernels(shapes) and weight_bytes(shapes) < 0.65 * weight_bytes(
        program().eval_shape())
    q = init.lower().compile()
    mem = q.memory_analysis()
    out = mem.output_size_in_bytes + mem.host_output_size_in_bytes
    assert weight_bytes(shapes) <= out < 1.01 * weight_bytes(shapes)   # (tiles' padding)
    if offload == "none":
        assert mem.temp_size_in_bytes == 0
    else:
        assert mem.host_output_size_in_bytes > 0.5 * out     # the block kernels
        assert mem.temp_size_in_bytes <= mem.host_output_size_in_bytes
        assert "s8[2,512,1024]{2,1,0:T(8,128)(4,1)S(5)}" in q.as_text()


def test_fp8_activations_refused_on_tpus_without_fp8_units():
    """fp8 x fp8 on v5e / v5p / v6e: one ConfigError naming the value, the chip and both
    fixes; TPU7x (fp8 units), CPU (emulates, as the tests run it), int8 activations and fp8
    weights only pass."""
    for kind in ("TPU v5 lite", "TPU v5", "TPU v6 lite"):
        with pytest.raises(ConfigError) as e:
            check_dots("fp8", True, [SimpleNamespace(platform="tpu", device_kind=kind)])
        msg = str(e.value)
        assert "\n" not in msg and "model.quantize=fp8" in msg and kind in msg
        assert "model.quantize=int8" in msg and "model.quantize_activations=false" in msg
    check_dots("fp8", True, [SimpleNamespace(platform="tpu", device_kind="TPU7x")])
    check_dots("fp8", True, [SimpleNamespace(platform="cpu", device_kind="cpu")])
    check_dots("int8", True, [V5E])
    check_dots("fp8", False, [V5E])
    assert native_dots("fp8", True, "tpu", "TPU7x") and native_dots("int8", True, "tpu", "TPU v5")
    assert not native_dots("fp8", True, "tpu", "TPU v6 lite")


@needs_libtpu
def test_fp8_activations_refused_by_plan_for_v5e(capsys):
    """``ditax plan --target tpu-v5e-1 model.quantize=fp8 model.quantize_activations=true``
    exits 2 with the one-line refusal before anything compiles; fp8 weights only plan."""
    from ditax.cli import main

    rc = main(["plan", "tiny", "--target", "tpu-v5e-1", "--compile", "model.quantize=fp8",
               "model.quantize_activations=true"])
    err = capsys.readouterr().err
    assert rc == 2 and "TPU v5 lite has no fp8 matrix unit" in err, err
    assert "compiled in" not in capsys.readouterr().out
    assert main(["plan", "tiny", "--target", "tpu-v5e-1", "model.quantize=fp8"]) == 0


def test_bench_times_the_quantized_model(caplog, capsys):
    """``ditax bench tiny model.quantize=int8 model.quantize_activations=true``: the random
    transformer it times is the 8-bit one (the init says so), and the row comes out."""
    import json
    import logging

    from ditax.cli import main

    with caplog.at_level(logging.INFO, logger="ditax.models.common.loaded"):
        assert main(["bench", "tiny", "--latent", "1,4,4", "--repeats", "1", "--no-progress",
                     "--text-len", "4", "model.quantize=int8",
                     "model.quantize_activations=true"]) == 0
    assert "random init: block linears in int8 weights x int8 activations" in caplog.text
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["metric"] == "forward"
