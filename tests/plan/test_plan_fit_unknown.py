"""``ditax plan --fit`` never says "fits" for a phase it did not measure (issue 57 item 5):
every family's published text encoders are counted (FLUX.1's CLIP-L and T5-XXL, FLUX.2's
Qwen3 / Mistral, LTX-2's Gemma-3), and a phase not measured (another family's VAE decode, a
skipped decode, a test model's own encoder) makes the verdict "not known", naming it. The
denoise step is stood in for (its compile is :mod:`test_plan_fit`'s), so nothing compiles."""

from __future__ import annotations

import jax
import pytest

from ditax.config import load_config
from ditax.models.base import model_family
from ditax.parallel import make_mesh
from ditax.plan import fit as fitmod
from ditax.plan.fit_phases import encoder_bytes, text_configs
from ditax.plan.targets import parse_target

GB = 1e9


@pytest.mark.parametrize("preset, names, weights_gb", [
    ("wan2.1-t2v-1.3b", ["UMT5-XXL"], (11, 12)),
    ("flux.1-dev", ["CLIP-L", "T5-XXL"], (9.5, 10)),
    ("flux.2-klein-4b", ["Qwen3-4B"], (7.9, 8.2)),
    ("flux.2-klein-9b", ["Qwen3-8B"], (15, 15.3)),
    ("flux.2-dev", ["Mistral-Small-3.1"], (45, 47)),
    ("ltx-2", ["Gemma-3-12B"], (23, 24)),
])
def test_every_familys_published_text_encoders_are_counted(preset, names, weights_gb):
    cfg = load_config(preset, ["model.dtype=bfloat16", "model.param_dtype=bfloat16"])
    found = text_configs(model_family(cfg.model), "bfloat16")
    assert [n for n, _ in found] == names
    total = sum(encoder_bytes(c) for _, c in found)
    assert weights_gb[0] * GB < total < weights_gb[1] * GB, total / GB
    # 8-bit block linears: about half
    assert sum(encoder_bytes(c, "int8") for _, c in found) < 0.6 * total


def _step(device_param_bytes: int) -> dict:
    """What :func:`ditax.plan.fit_phases.denoise` reports, for a step that fits any chip."""
    return {"compiled_layers": 1, "layers": 1, "latent": [1, 32, 1, 64, 64],
            "peak_bytes": device_param_bytes + 10 ** 8, "temp_bytes": 10 ** 8,
            "device_buffer_bytes": device_param_bytes, "device_temp_bytes": 10 ** 8,
            "device_peak_bytes": device_param_bytes + 10 ** 8,
            "device_argument_bytes": device_param_bytes, "host_argument_bytes": 0,
            "host_to_device_bytes": 0, "compute_s": 0.1, "hbm_s": 0.05, "compile_s": 0.0,
            "device_param_bytes": device_param_bytes, "host_param_bytes": 0,
            "streams_each_layer_once": True, "host_s": 0.0, "host_over_compute": 0.0,
            "step_s_overlapped": 0.1, "step_s_serial": 0.1}


@pytest.fixture
def stand_in_step(monkeypatch):
    monkeypatch.setattr(fitmod, "denoise", lambda cfg, *a, **k: _step(10 ** 9))


def _fit(preset, overrides=(), **kw):
    cfg = load_config(preset, ["mesh.fsdp=1", *overrides])
    target = parse_target("tpu-v5e-1")
    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    return fitmod.fit(cfg, mesh, target.chip, **kw)


def test_flux2_klein_counts_qwen3_and_does_not_know_its_decode(stand_in_step):
    out = _fit("flux.2-klein-4b")
    row = out["rungs"][0]
    assert out["text_encoders"] == ["Qwen3-4B"]
    assert row["text"]["encoder_weight_bytes"] > 8 * GB       # the 4B encoder counted
    assert "decode" not in row
    v = out["verdict"]
    assert v["decode"]["fits"] is None and v["decode"]["suggestion"].startswith("not known")
    assert v["all"]["fits"] is None
    assert v["all"]["suggestion"].startswith("not known") and "decode" in v["all"]["suggestion"]
    assert "fits as configured" not in v["all"]["suggestion"]
    assert v["all"]["suggestion"].endswith("the measured phases fit as configured")
    assert "NOT measured" in out["measured"] and "Qwen3-4B" in out["analytic"]


def test_a_test_models_own_encoder_makes_the_text_phase_not_known(stand_in_step):
    out = _fit("tiny", ["sample.height=32", "sample.width=32"], decode_=False)
    v = out["verdict"]
    assert v["text"]["fits"] is None and "text width" in v["text"]["suggestion"]
    assert v["decode"]["suggestion"] == "not known: skipped (--fit-no-decode)"
    assert v["all"]["fits"] is None and "text" in v["all"]["suggestion"] \
        and "decode" in v["all"]["suggestion"]


def test_every_phase_measured_may_fit_and_one_that_does_not_fit_is_said():
    rows = [{"changes": "as configured", "text": {"bytes": 1}, "denoise": {"bytes": 1},
             "decode": {"bytes": 1}}]
    v = fitmod.verdict([fitmod._judge_row(r, 10) for r in rows], None, 10, "v5e")
    assert v["all"] == {"fits": True, "suggestion": "fits as configured"}
    rows = [{"changes": "as configured", "denoise": {"bytes": 100}}]
    v = fitmod.verdict([fitmod._judge_row(r, 10) for r in rows], None, 10, "v5e",
                       {"text": "not modelled", "decode": "not modelled"})
    assert v["all"]["fits"] is False                    # the known phase does not fit
    assert v["all"]["suggestion"].startswith("not known: text (not modelled), decode")
    assert "the measured phases do not: denoise: more chips" in v["all"]["suggestion"]
