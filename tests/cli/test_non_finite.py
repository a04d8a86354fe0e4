"""No non-finite output is a success (issue 41, class 1): latents or frames that become NaN /
inf end the run with one line naming the phase and the likely causes, exit 1, and nothing is
written under the requested name; a LoRA strength past ±10 is refused before any work."""

import numpy as np
import pytest

import ditax
from ditax.cli import main
from ditax.errors import NonFiniteOutput

pytestmark = pytest.mark.usefixtures("fast_compile")


def test_generate_refuses_to_write_a_non_finite_video(tmp_path, capsys):
    out = tmp_path / "nan.mp4"
    rc = main(["generate", "--model", "demo", "--prompt", "a red circle moves right",
               "--guidance", "3e38", "--steps", "2", "--output", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert "denoise: the latents after 2 steps hold NaN / inf" in err[0], err
    assert "--debug" not in err[0] and not out.exists()
    assert not list(tmp_path.iterdir())       # no partial file either


def test_the_library_raises_instead_of_returning_nan():
    from ditax.demo import model_path

    pipe = ditax.load_pipeline(model_path())
    with pytest.raises(NonFiniteOutput, match="guidance scale too large"):
        pipe("a red circle", guidance_scale=3e38, num_inference_steps=2, progress=False)
    ok = pipe("a red circle", num_inference_steps=2, progress=False)
    assert np.isfinite(ok).all()


@pytest.mark.parametrize("strength", ["1e30", "-11", "10.5"])
def test_lora_strength_past_ten_is_refused_before_any_work(tmp_path, capsys, strength):
    rc = main(["generate", "--model", "demo", "--prompt", "x", "--lora",
               f"{tmp_path / 'style.safetensors'}:{strength}", "--output",
               str(tmp_path / "o.mp4"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is beyond ±10" in err[0], err


def test_a_nan_in_a_weight_file_is_named_at_load(tmp_path):
    from quant_folders import write_wan_folder
    from safetensors.numpy import load_file, save_file

    from ditax.errors import WeightError

    folder = write_wan_folder(tmp_path / "transformer")
    file = folder / "diffusion_pytorch_model.safetensors"
    tensors = load_file(str(file))
    key = next(k for k in sorted(tensors) if k.endswith("ffn.net.0.proj.weight"))
    tensors[key][0, 0] = np.nan
    save_file(tensors, str(file))
    with pytest.raises(WeightError, match=r"parameter .*ffn.* holds NaN / inf after loading"):
        ditax.load_transformer(folder)
