"""``ditax plan --fit``: what fits one chip, phase by phase, compiled for a TPU without one
(deviceless v6e, one chip) on the tiny Wan model with a small UMT5 and a small Wan VAE.

The compiled numbers do not depend on the chip's capacity, so one report (every rung of the
ladder) is judged against several capacities: one between the offloaded and the resident
step's bytes makes offload the suggestion. The host traffic is checked against the abstract
model (every offloaded layer's weights once a step, the prefetch's one more) and the layer
scaling against a compile of every layer. Skips (with the install line) without libtpu."""

import importlib.util

import jax
import pytest

from ditax.cli import main
from ditax.config import load_config
from ditax.models.encoders.umt5 import UMT5Config
from ditax.models.vae.wan import WanVAEConfig
from ditax.plan import fit as fitmod
from ditax.plan import fit_phases
from ditax.plan.measure import HOST_LINK_BYTES_PER_S

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason=f'libtpu is not installed: pip install "jax[tpu]=={jax.__version__}"')

#: enough layers that offloading them saves more than the streamed layers' temporaries cost
#: (with 4, the tiny model's offloaded step held more on the device than the resident one)
LAYERS = 16
OVERRIDES = [f"model.num_layers={LAYERS}", "model.dtype=bfloat16", "model.param_dtype=bfloat16",
             "sample.guidance_scale=5.0", "sample.height=32", "sample.width=32"]
TEXT = [("UMT5-small", UMT5Config(vocab_size=512, d_model=64, d_kv=16, num_heads=4,
                                  d_ff=2048, num_layers=2, dtype="bfloat16"))]
# one level, 2x in space and time: its TPU compile takes seconds (the 8x one's, a minute)
VAE = WanVAEConfig(base_dim=4, dim_mult=(1, 1), temperal_downsample=(True,), num_res_blocks=1)
LADDER = ["as configured", "model.offload=host", "model.offload=host + model.quantize=int8",
          "model.offload=host + model.quantize=int8 + text_quantize=int8"]


def test_the_ladder_adds_one_change_at_a_time_and_skips_what_the_config_has():
    cfg = load_config("tiny", [])
    assert [label for label, _ in fitmod.rungs(cfg)] == LADDER
    last = fitmod.rungs(cfg)[-1][1]
    assert last == {"offload": "host", "quantize": "int8", "text_offload": "host",
                    "text_quantize": "int8"}
    # already 8-bit: no int8 rung; text_offload given: offload leaves it as given
    have = fitmod.rungs(load_config("tiny", ["model.quantize=fp8"]), text_offload="none")
    assert [label for label, _ in have] == ["as configured", "model.offload=host",
                                           "model.offload=host + text_quantize=int8"]
    assert have[1][1] == {"offload": "host", "quantize": "fp8", "text_offload": "none",
                          "text_quantize": "none"}


def test_fit_refuses_a_target_that_is_not_one_chip(capsys):
    rc = main(["plan", "tiny", "--target", "cpu:2", "--fit", "mesh.fsdp=2"])
    assert rc == 2 and "tpu-v5e-1" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tpu():
    from ditax.front.run import run_context
    from ditax.parallel import make_mesh
    from ditax.plan.targets import parse_target, topology_devices

    target = parse_target("tpu-v6e-1")
    cfg = load_config("tiny", OVERRIDES)
    mesh = make_mesh(cfg.mesh, topology_devices(target))
    with run_context(cfg.attention, mesh, compile_cache="none"):
        yield cfg, mesh, target.chip


@pytest.fixture(scope="module")
def report(tpu):
    cfg, mesh, chip = tpu
    return fitmod.fit(cfg, mesh, chip, every_rung=True, vae_cfg=VAE, text_encoders=TEXT)


@needs_libtpu
def test_offload_turns_a_step_that_does_not_fit_into_one_that_does(report):
    rows = report["rungs"]
    assert [r["changes"] for r in rows] == LADDER
    assert (report["batch"], report["experts"]) == (2, 1)       # batched CFG, one transformer
    resident, offloaded = rows[0]["denoise"]["bytes"], rows[1]["denoise"]["bytes"]
    assert offloaded < resident
    # a chip between the two: the step does not fit as configured and does with offload
    v = fitmod.judge(report, (resident + offloaded) / 2)["verdict"]
    assert v["denoise"]["fits"] is False and v["denoise"]["suggestion"] == "model.offload=host"
    assert not rows[0]["denoise"]["fits"] and rows[1]["denoise"]["fits"]
    # a chip that holds it all: nothing to change
    v = fitmod.judge(report, 1e12)["verdict"]
    assert v["denoise"]["suggestion"] == v["all"]["suggestion"] == "fits as configured"
    # a chip smaller than every rung's step: more chips
    v = fitmod.judge(report, offloaded / 2)["verdict"]
    assert v["denoise"]["suggestion"].startswith("more chips: tpu-v6e-")


@needs_libtpu
def test_the_text_phase_is_fixed_by_the_first_rung_that_shrinks_it(report):
    rows = report["rungs"]
    text = [r["text"]["bytes"] for r in rows]
    # 8-bit block linears: the encoder's weights fall by about half of their bf16 bytes
    w = [r["text"]["encoder_weight_bytes"] for r in rows]
    assert w[3] < w[2] * 0.75 and w[0] == w[1] == w[2]
    assert text[3] < text[2]
    v = fitmod.judge(report, (text[2] + text[3]) / 2)["verdict"]
    assert v["text"]["suggestion"] == LADDER[3]
    # the decode: compiled, and the transformer's resident weights count in it
    assert rows[0]["decode"]["bytes"] - rows[1]["decode"]["bytes"] == (
        rows[0]["denoise"]["step"]["device_param_bytes"]
        - rows[1]["denoise"]["step"]["device_param_bytes"]
        + w[0])                                        # and the encoder, kept without offload
    assert report["decode"]["peak_bytes"] > report["decode"]["vae_weight_bytes"] > 0


@needs_libtpu
def test_host_traffic_is_the_compiled_programs_and_scales_with_layers(report, tpu):
    cfg, mesh, chip = tpu
    step = report["rungs"][1]["denoise"]["step"]
    host = step["host_param_bytes"]                    # the abstract model's offloaded bytes
    assert step["host_argument_bytes"] == host > 0
    # each layer's weights stream once a step, and (prefetch 1) the last once more
    assert step["host_to_device_bytes"] * LAYERS == host * (LAYERS + 1)
    assert step["streams_each_layer_once"]
    assert step["host_s"] == step["host_to_device_bytes"] / HOST_LINK_BYTES_PER_S
    assert step["host_over_compute"] == step["host_s"] / step["compute_s"]
    # two layers compiled, scaled to all: the every-layer compile's numbers
    small = fit_phases.with_model(cfg, num_layers=2, offload="host")
    scaled = fit_phases.denoise(small, mesh, chip, batch=2, full_layers=LAYERS)
    assert scaled["compiled_layers"] == 2 and scaled["layers"] == LAYERS
    for k in ("host_to_device_bytes", "host_argument_bytes", "device_argument_bytes",
              "host_param_bytes", "device_param_bytes"):
        assert scaled[k] == step[k], k
    # compute in proportion to the model's FLOPs (the compiled count adds a little outside
    # the layers: within 2 % on this tiny model)
    assert abs(scaled["compute_s"] / step["compute_s"] - 1) < 0.02
    assert abs(scaled["peak_bytes"] / step["peak_bytes"] - 1) < 0.05


@needs_libtpu
def test_the_table_says_what_is_measured_and_what_is_assumed(report):
    from ditax.cli.plan import fit_table

    text = fit_table({"config": "tiny", "target": "tpu-v6e-1", **report})
    assert "ASSUMED" in text and "compiled" in text and "host->device" in text
    assert all(label in text for label in LADDER)
