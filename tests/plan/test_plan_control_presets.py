"""The public VACE / Animate presets resolve to the diffusers models' architectures: ``ditax
plan PRESET --json`` (no compile, one CPU device) counts the parameters diffusers' own classes
have for the public configs (counted once on torch's meta device:
``WanVACETransformer3DModel(**config)`` / ``WanAnimateTransformer3DModel(**config)``, the
``transformer/config.json`` of Wan-AI/Wan2.1-VACE-{1.3B,14B}-diffusers and
Wan-AI/Wan2.2-Animate-14B-Diffusers), all stored in bfloat16; the Animate preset is read into the
Animate config (its motion / face fields pick the variant)."""

import json

import pytest

from ditax.cli import main

DIFFUSERS_PARAMS = {"wan2.1-vace-1.3b": 2_153_972_032, "wan2.1-vace-14b": 17_337_592_896,
                    "wan2.2-animate-14b": 17_274_816_884}


def vace_params(d: int, m: int, layers: int, vace_layers: int, text: int = 4096,
                freq: int = 256, z: int = 16, control: int = 96) -> int:
    """A Wan VACE transformer's parameter count from its shape (a second, closed-form check)."""
    block = 8 * d * d + 2 * d * m + 21 * d + m        # attn1, attn2 (+ norms), norm2, FFN, table
    top = (z * 4 * d + d) + (text * d + d + d * d + d) + (freq * d + d + d * d + d) \
        + (d * 6 * d + 6 * d) + (d * z * 4 + z * 4) + 2 * d
    vace = vace_layers * (block + d * d + d) + (d * d + d) + (control * 4 * d + d)
    return layers * block + top + vace


@pytest.mark.parametrize("preset", sorted(DIFFUSERS_PARAMS))
def test_control_preset_plans_the_public_model(preset, capsys):
    rc = main(["plan", preset, "--devices", "1", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    res = json.loads(out)
    assert res["params"] == DIFFUSERS_PARAMS[preset]
    assert res["param_bytes_total"] == 2 * res["params"]      # bfloat16
    if preset.startswith("wan2.1-vace"):
        d, m, layers, n = (1536, 8960, 30, 15) if "1.3b" in preset else (5120, 13824, 40, 8)
        assert vace_params(d, m, layers, n) == res["params"]
    names = {row[0] for row in res["shardings"]}
    assert any(n.startswith("vace_blocks") for n in names) == preset.startswith("wan2.1-vace")
    assert any(n.startswith("face_adapter") for n in names) == (preset == "wan2.2-animate-14b")
